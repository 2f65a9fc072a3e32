"""Builds the package with the gRPC stubs generated from the repository's proto/mentis/v1 into `mentis.v1`
(`mentis/v1/*_pb2.py`, `*_pb2_grpc.py` and `.pyi` files), so the wheel always matches the protos it was
built from. Everything else is in pyproject.toml."""

import pathlib

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent
PROTO = HERE.parent.parent / "proto"


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


setup(cmdclass={"build_py": BuildWithStubs})
