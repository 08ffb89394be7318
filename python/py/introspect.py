"""Dump SGLang's real argparse parser as a flag schema (JSON on stdout).

Run by `sglang-supervisor flags --sglang PYTHON` in the target interpreter, so that interpreter's
site-packages (its SGLang) are the ones read. Builds the parser the way every version does:
ServerArgs.add_cli_args(argparse.ArgumentParser(prog="sglang serve")).
"""
import argparse
import json
import sys


def jsonable(v):
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple, set, frozenset)):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if v is argparse.SUPPRESS:
        return "==SUPPRESS=="
    return repr(v)


def main():
    import sglang
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    actions = []
    for a in parser._actions:
        cls = type(a).__name__
        help_text = a.help if isinstance(a.help, str) else None
        entry = {
            "option_strings": list(a.option_strings),
            "dest": a.dest,
            "nargs": a.nargs,
            "default": jsonable(a.default),
            "choices": jsonable(list(a.choices)) if a.choices is not None else None,
            "type": getattr(a.type, "__name__", None) if a.type is not None else None,
            "action": cls,
            "required": a.required,
            "const": jsonable(a.const),
            "help": help_text,
        }
        if cls.startswith("Deprecated"):
            entry["deprecated"] = True
            if getattr(a, "new_flag", None):
                entry["new_flag"] = a.new_flag
        actions.append(entry)
    json.dump({"sglang_version": getattr(sglang, "__version__", None), "method": "import",
               "python": sys.version.split()[0], "actions": actions}, sys.stdout)


if __name__ == "__main__":
    main()
