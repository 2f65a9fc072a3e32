"""mentis.integrations without its frameworks (this folder's environment has only the wheel and pytest; the
tools themselves are tested in ../tests_integrations): the package imports none, and each framework's module
says which extra to install."""

from __future__ import annotations

import importlib
import re
import sys

import pytest


@pytest.mark.parametrize("name, framework", [("langchain", "langchain_core"), ("crewai", "crewai")])
def test_a_missing_framework_names_the_extra_to_install(name, framework, monkeypatch):
    # Missing even where it is installed: an import of it fails as it would without it.
    monkeypatch.setitem(sys.modules, framework, None)
    monkeypatch.delitem(sys.modules, f"mentis.integrations.{name}", raising=False)
    importlib.import_module("mentis.integrations")
    with pytest.raises(ImportError, match=re.escape(f"pip install 'mentis-sandbox[{name}]'")):
        importlib.import_module(f"mentis.integrations.{name}")
