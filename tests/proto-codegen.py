#!/usr/bin/env python3
"""Clients in other languages generate code from our protos with no flags beyond where to write: protoc's
own generators (Java, C#, Objective-C, PHP, Ruby, Python) and protoc-gen-go / protoc-gen-go-grpc run on every
proto, and what they write lands in the package the file options name. Run by `make lint` with the project's
venv (grpcio-tools brings the well-known types) and Debian's protoc (deploy/ensure-tools.sh)."""
import pathlib
import shutil
import subprocess
import sys
import tempfile

import grpc_tools

root = pathlib.Path(__file__).resolve().parent.parent
protos = sorted(str(p.relative_to(root / "proto")) for p in (root / "proto").rglob("*.proto"))
include = pathlib.Path(grpc_tools.__file__).parent / "_proto"
languages = ["java", "csharp", "objc", "php", "ruby", "python", "go", "go-grpc"]
for tool in ["protoc", "protoc-gen-go", "protoc-gen-go-grpc"]:
    if shutil.which(tool) is None:
        sys.exit(f"proto-codegen: {tool} is missing: deploy/ensure-tools.sh (make tools) installs it")
with tempfile.TemporaryDirectory() as out:
    outs = {lang: pathlib.Path(out, lang) for lang in languages}
    for d in outs.values():
        d.mkdir()
    args = ["protoc", f"-I{root / 'proto'}", f"-I{include}"]
    args += [f"--{lang}_out={outs[lang]}" for lang in languages] + protos
    run = subprocess.run(args, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"proto-codegen: protoc failed: {run.stderr}")
    expected = {
        "java": ["com/mentis/v1/ActionProto.java", "com/mentis/v1/IPythonResult.java",
                 "com/mentis/executor/v1/ExecutorProto.java"],
        "csharp": ["Action.cs", "Executor.cs"],
        "objc": ["mentis/v1/Action.pbobjc.h"],
        "php": ["Mentis/V1/IPythonResult.php", "Mentis/Executor/V1/RunRequest.php"],
        "ruby": ["mentis/v1/action_pb.rb"],
        "python": ["mentis/v1/action_pb2.py"],
        "go": ["mentis/gen/go/mentis/v1/action.pb.go", "mentis/gen/go/mentis/executor/v1/executor.pb.go"],
        "go-grpc": ["mentis/gen/go/mentis/v1/action_grpc.pb.go"],
    }
    missing = [f"{lang}: {f}" for lang, files in expected.items() for f in files
               if not (outs[lang] / f).exists()]
    if missing:
        sys.exit("proto-codegen: not generated where the options say: " + ", ".join(missing))
    checks = [("csharp", "Action.cs", "namespace Mentis.V1"), ("ruby", "mentis/v1/action_pb.rb", "module V1"),
              ("objc", "mentis/v1/Action.pbobjc.h", "MXX"),
              ("go", "mentis/gen/go/mentis/v1/action.pb.go", "package mentisv1")]
    wrong = [f"{lang} {f} lacks {text!r}" for lang, f, text in checks if text not in (outs[lang] / f).read_text()]
    if wrong:
        sys.exit("proto-codegen: " + "; ".join(wrong))
print(f"proto-codegen: {len(protos)} protos generate for {', '.join(languages)} with no flags")
