"""Builds the package with the gRPC stubs generated from the repository's proto/mentis/v1 into `mentis.v1`
(`mentis/v1/*_pb2.py`, `*_pb2_grpc.py` and `.pyi` files), so the wheel always matches the protos it was
built from. With `MENTIS_SDK_RUNTIME_BIN` set (make sdk sets it), that mentis-runtime binary is shipped in
the wheel (`mentis/_bin/`) for embedded mode, and the wheel is tagged for this platform. Everything else is
in pyproject.toml."""

import os
import pathlib
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

HERE = pathlib.Path(__file__).resolve().parent
PROTO = HERE.parent.parent / "proto"
RUNTIME = os.environ.get("MENTIS_SDK_RUNTIME_BIN")


class BuildWithStubs(build_py):
    def run(self):
        super().run()
        import grpc_tools
        from grpc_tools import protoc

        include = pathlib.Path(grpc_tools.__file__).parent / "_proto"
        out = pathlib.Path(self.build_lib)
        protos = sorted(str(p.relative_to(PROTO)) for p in (PROTO / "mentis" / "v1").glob("*.proto"))
        if not protos:
            raise SystemExit(f"no protos under {PROTO / 'mentis' / 'v1'}")
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO}",
            f"-I{include}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            f"--pyi_out={out}",
            *protos,
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed on " + " ".join(protos))
        (out / "mentis" / "v1" / "__init__.py").write_text('"""Generated from proto/mentis/v1."""\n')
        shipped = out / "mentis" / "_bin" / "mentis-runtime"
        if RUNTIME:
            if not os.access(RUNTIME, os.X_OK):
                raise SystemExit(f"MENTIS_SDK_RUNTIME_BIN={RUNTIME} is not an executable file")
            shipped.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(RUNTIME, shipped)
            shipped.chmod(0o755)
        elif shipped.exists():
            shipped.unlink()  # left by an earlier build that shipped one


class PlatformWheel(bdist_wheel):
    """A wheel with a binary in it is for this platform only (any Python 3)."""

    def finalize_options(self):
        super().finalize_options()
        if RUNTIME:
            self.root_is_pure = False

    def get_tag(self):
        python, abi, platform = super().get_tag()
        return ("py3", "none", platform) if RUNTIME else (python, abi, platform)


setup(cmdclass={"build_py": BuildWithStubs, "bdist_wheel": PlatformWheel})
