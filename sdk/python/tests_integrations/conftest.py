"""The SDK tests' runtime (sdk/python/tests/conftest.py: `MENTIS_RUNTIME_BIN` on a free port with a data
folder of its own, real Docker sandboxes behind it), loaded from its file so that it is the same fixture
whatever the rootdir, the import mode or the folder pytest is started from."""

from __future__ import annotations

import importlib.util
import pathlib

_path = pathlib.Path(__file__).resolve().parent.parent / "tests" / "conftest.py"
_spec = importlib.util.spec_from_file_location("mentis_sdk_tests_runtime", _path)
assert _spec and _spec.loader, _path
_shared = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_shared)

runtime = _shared.runtime
env = _shared.env
proxy = _shared.proxy
