"""The truth for `flags audit`: Python's own argparse on SGLang's real parser.

Reads a JSON list of argvs on stdin; builds the parser as SGLang does
(ServerArgs.add_cli_args(argparse.ArgumentParser(prog="sglang serve"))) from the sglang first on
sys.path; prints, per argv, {"exit": N, "error": "<argparse's message>", "help": bool}.
Modules in STUB_MODULES (argv[1], comma-separated) are stood in for when absent: compiled
extensions that only model code imports, never the parser.
"""
import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import io
import json
import sys
import types


class _Any(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Any(name, (), {})


class _Stub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names):
        self.names = {n for n in names if n and importlib.util.find_spec(n) is None}

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        m = types.ModuleType(spec.name)
        m.__path__ = []

        def attr(name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _Any(name, (), {})

        m.__getattr__ = attr
        return m

    def exec_module(self, module):
        pass


def main():
    sys.meta_path.append(_Stub(sys.argv[1].split(",") if len(sys.argv) > 1 else []))
    import argparse
    import logging

    logging.disable(logging.CRITICAL)
    import sglang
    from sglang.srt.server_args import ServerArgs

    argvs = json.load(sys.stdin)
    out = []
    for argv in argvs:
        parser = argparse.ArgumentParser(prog="sglang serve")
        ServerArgs.add_cli_args(parser)
        err, std = io.StringIO(), io.StringIO()
        code = 0
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(std):
            try:
                parser.parse_args(argv)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 2
        msg = next((l.split(": error: ", 1)[1] for l in err.getvalue().splitlines() if ": error: " in l), None)
        out.append({"exit": code, "error": msg, "help": code == 0 and "usage:" in std.getvalue()})
    print(json.dumps({"sglang_version": sglang.__version__, "python": sys.version.split()[0], "results": out}))


if __name__ == "__main__":
    main()
