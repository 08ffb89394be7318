"""SGLang's launch-flag schema, read two ways (compiled into sglang-supervisor).

  import  build the real parser the way every version does,
          ServerArgs.add_cli_args(argparse.ArgumentParser(prog="sglang serve")), and read its actions;
  static  read the sources of a .whl or an unpacked tree with `ast`, nothing imported (no torch):
          follow the per-version machinery (annotated ServerArgs fields up to 0.5.19,
          arg_groups/fields/*.py namespaces from 0.5.20, manual add_argument calls, aliases,
          no_cli, BooleanOptionalAction, Deprecated* actions). Literal defaults/choices and the
          constants they name are evaluated; anything else is {"unresolved": "<source>"}.

Both print the same JSON shape, plus the SGLANG_* environment variables the version defines
(sglang/srt/environ.py, read statically in both modes).

Run embedded (sglang-supervisor calls `schema(...)`) or as a script:
  python3 -c "$MODULE" import            |  python3 -c "$MODULE" static PATH
"""
import argparse
import ast
import json
import os
import sys
import zipfile

# Actions argparse registers by string, with the class name the parser ends up holding.
_ACTION_CLASS = {
    None: "_StoreAction", "store": "_StoreAction", "store_true": "_StoreTrueAction",
    "store_false": "_StoreFalseAction", "store_const": "_StoreConstAction",
    "append": "_AppendAction", "append_const": "_AppendConstAction", "count": "_CountAction",
    "extend": "_ExtendAction",
}
_ZERO_ARG = {"store_true", "store_false", "store_const", "append_const", "count"}


def jsonable(v):
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (set, frozenset)):
        return sorted((jsonable(x) for x in v), key=repr)
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if v is argparse.SUPPRESS:
        return "==SUPPRESS=="
    if isinstance(v, ActionRef):
        return v.name
    if hasattr(v, "value") and isinstance(getattr(v, "value"), (int, str)):
        return v.value  # enums, as the saved dumps hold them
    return {"__repr__": repr(v)}


# ---------------------------------------------------------------------------------------------
# Sources: a wheel, an unpacked site-packages / source tree, or the tree an import resolves to.


class Sources:
    def __init__(self, path):
        self.path = path
        self.zip = None
        if os.path.isfile(path):
            try:
                self.zip = zipfile.ZipFile(path)
            except (zipfile.BadZipFile, OSError) as e:
                raise SystemExit(f"{path}: not a readable wheel ({e})")
            self.names = set(self.zip.namelist())
            self.root = ""
        else:
            roots = [path, os.path.join(path, "python")]  # a git checkout keeps sglang/ in python/
            root = next((r for r in roots if os.path.isfile(os.path.join(r, "sglang", "srt", "server_args.py"))), None)
            if root is None and os.path.basename(os.path.normpath(path)) == "sglang":
                root = os.path.dirname(os.path.normpath(path))
            if root is None or not os.path.isfile(os.path.join(root, "sglang", "srt", "server_args.py")):
                raise SystemExit(f"{path}: no sglang/srt/server_args.py under it (give a .whl, a site-packages or an sglang source tree)")
            self.root = root
        if not self.has("sglang/srt/server_args.py"):
            raise SystemExit(f"{path}: the wheel holds no sglang/srt/server_args.py (is it an sglang wheel?)")

    def has(self, rel):
        if self.zip is not None:
            return rel in self.names
        return os.path.isfile(os.path.join(self.root, rel))

    def read(self, rel):
        if self.zip is not None:
            return self.zip.read(rel).decode("utf-8")
        with open(os.path.join(self.root, rel), encoding="utf-8") as f:
            return f.read()

    def module_file(self, name):
        base = name.replace(".", "/")
        for rel in (base + ".py", base + "/__init__.py"):
            if self.has(rel):
                return rel
        return None


class Unresolved(Exception):
    pass


class Module:
    """One source file: its top-level assignments, imports, classes and functions, by name."""

    def __init__(self, ctx, name, rel):
        self.ctx, self.name = ctx, name
        self.tree = ast.parse(ctx.src.read(rel), rel)
        self.assigns, self.imports, self.defs, self.cache = {}, {}, {}, {}
        pkg = name if rel.endswith("__init__.py") else name.rpartition(".")[0]
        for node in self.tree.body:
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        self.assigns[t.id] = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                self.assigns[node.target.id] = node.value
            elif isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                if node.level:
                    up = pkg.split(".")
                    up = up[: len(up) - (node.level - 1)]
                    mod = ".".join(up + ([mod] if mod else []))
                for a in node.names:
                    self.imports[a.asname or a.name] = (mod, a.name)
            elif isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                self.defs[node.name] = node

    def lookup(self, name):
        if name in self.cache:
            if self.cache[name] is Unresolved:
                raise Unresolved(name)
            return self.cache[name]
        self.cache[name] = Unresolved  # a cycle resolves to nothing
        if name in self.assigns:
            value = self.ctx.ev(self.assigns[name], self, {})
        elif name in self.imports and self.ctx.module(self.imports[name][0]) is not None:
            value = self.ctx.module(self.imports[name][0]).lookup(self.imports[name][1])
        else:
            raise Unresolved(name)
        self.cache[name] = value
        return value

    def find_def(self, name):
        """The class or function `name` names here, following imports."""
        if name in self.defs:
            return self, self.defs[name]
        if name in self.imports:
            m = self.ctx.module(self.imports[name][0])
            if m is not None:
                return m.find_def(self.imports[name][1])
        return None, None


class ActionRef:
    """A reference to an action class (argparse's or SGLang's), kept by name."""

    def __init__(self, name):
        self.name = name


class Static:
    def __init__(self, path):
        self.src = Sources(path)
        self.modules = {}
        self.fields = {}  # field name -> its default, for _declared_default()

    def module(self, name):
        if name not in self.modules:
            rel = self.src.module_file(name) if name.startswith("sglang") else None
            self.modules[name] = Module(self, name, rel) if rel else None
        return self.modules[name]

    # -- a small evaluator: literals, the constants they name, and a few pure builtins --------
    def ev(self, node, mod, scope):
        ev = lambda n: self.ev(n, mod, scope)  # noqa: E731
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            out = []
            for e in node.elts:
                if isinstance(e, ast.Starred):
                    out.extend(ev(e.value))
                else:
                    out.append(ev(e))
            return {ast.List: list, ast.Tuple: tuple, ast.Set: set}[type(node)](out)
        if isinstance(node, ast.Dict):
            return {ev(k): ev(v) for k, v in zip(node.keys, node.values) if k is not None}
        if isinstance(node, ast.Name):
            if node.id in scope:
                if scope[node.id] is Unresolved:
                    raise Unresolved(node.id)
                return scope[node.id]
            if node.id in ("str", "int", "float", "bool"):
                return ActionRef(node.id)
            m, d = mod.find_def(node.id)
            if isinstance(d, (ast.ClassDef, ast.FunctionDef)):
                return ActionRef(node.id)  # an action class or a type= function, kept by name
            return mod.lookup(node.id)
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "ServerArgs" and node.attr in self.fields:
                return self.fields[node.attr]  # default=ServerArgs.x: the field's declared default
            if isinstance(node.value, ast.Name) and node.value.id == "argparse":
                return argparse.SUPPRESS if node.attr == "SUPPRESS" else ActionRef(node.attr)
            if isinstance(node.value, ast.Name):
                # A class constant or an enum member (`Backend.DISABLED`): its assigned value,
                # which is what the dumps hold for enums.
                m, cls = mod.find_def(node.value.id)
                found = self.class_attr(cls, node.attr)
                if found is not None:
                    return self.ev(found, m, self.class_scope(cls, m))
            raise Unresolved(ast.unparse(node))
        if isinstance(node, ast.BinOp):
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Add):
                return a + b
            if isinstance(node.op, ast.BitOr) and isinstance(a, (set, frozenset, dict)):
                return a | b
            raise Unresolved(ast.unparse(node))
        if isinstance(node, ast.JoinedStr):
            parts = []
            for v in node.values:
                if isinstance(v, ast.Constant):
                    parts.append(v.value)
                elif isinstance(v, ast.FormattedValue) and v.format_spec is None:
                    x = ev(v.value)
                    parts.append(repr(x) if v.conversion == ord("r") else str(x))
                else:
                    raise Unresolved(ast.unparse(node))
            return "".join(parts)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not node.args
                and node.func.attr in ("keys", "values", "items")):
            # `list(ReasoningParser.DetectorMap.keys())`: a registry that is a literal dict; its
            # keys are enough even when its values (detector classes) are not evaluable.
            target = node.func.value
            if node.func.attr == "keys" and isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
                m, cls = mod.find_def(target.value.id)
                found = self.class_attr(cls, target.attr)
                if isinstance(found, ast.Dict):
                    return [self.ev(k, m, {}) for k in found.keys if k is not None]
            d = ev(target)
            if isinstance(d, dict):
                return list(getattr(d, node.func.attr)())
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            f = node.func.id
            if f in ("list", "tuple", "set", "frozenset", "sorted") and len(node.args) == 1 and not node.keywords:
                return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset, "sorted": sorted}[f](ev(node.args[0]))
            m, fn = mod.find_def(f)
            if isinstance(fn, ast.FunctionDef) and not node.args and not fn.args.args:
                # A no-argument helper (`_reasoning_parser_choices()`): its last `return`, the
                # path taken when nothing was imported yet, with its own function-level imports.
                local = {}
                for st in fn.body:
                    if isinstance(st, ast.ImportFrom) and st.module and st.module.startswith("sglang"):
                        src = self.module(st.module)
                        for al in st.names:
                            try:
                                local[al.asname or al.name] = src.lookup(al.name) if src else Unresolved
                            except Unresolved:
                                local[al.asname or al.name] = Unresolved
                last = [st for st in fn.body if isinstance(st, ast.Return) and st.value is not None]
                if last:
                    return self.ev(last[-1].value, m, local)
            if f == "_declared_default" and len(node.args) == 1:
                name = ev(node.args[0])
                if name in self.fields:
                    return self.fields[name]
        raise Unresolved(ast.unparse(node))

    @staticmethod
    def class_attr(cls, name):
        """The expression a class body assigns to `name` (plain or annotated), or None."""
        for st in cls.body if isinstance(cls, ast.ClassDef) else []:
            if isinstance(st, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in st.targets):
                return st.value
            if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.target.id == name and st.value is not None:
                return st.value
        return None

    def class_scope(self, cls, mod):
        """The class body's earlier constants, for one that names them (`ALL = (FULL, ...)`)."""
        scope = {}
        for st in cls.body:
            if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
                try:
                    scope[st.targets[0].id] = self.ev(st.value, mod, scope)
                except (Unresolved, TypeError, ValueError, KeyError, RecursionError):
                    scope[st.targets[0].id] = Unresolved
        return scope

    def value(self, node, mod, scope=None):
        """A JSON-safe value, or {"unresolved": source} when it cannot be evaluated here."""
        try:
            v = self.ev(node, mod, scope or {})
        except (Unresolved, TypeError, ValueError, KeyError, RecursionError):
            return {"unresolved": ast.unparse(node)}
        return jsonable(v)

    # -- annotated fields -> add_argument calls, as add_cli_args_from_dataclass makes them ----
    @staticmethod
    def _strip_optional(t):
        if isinstance(t, ast.Subscript) and ast.unparse(t.value).split(".")[-1] == "Optional":
            return t.slice
        if isinstance(t, ast.Subscript) and ast.unparse(t.value).split(".")[-1] == "Union":
            elts = [e for e in getattr(t.slice, "elts", [t.slice]) if ast.unparse(e) != "None"]
            return elts[0] if len(elts) == 1 else t
        if isinstance(t, ast.BinOp) and isinstance(t.op, ast.BitOr):
            sides = [s for s in (t.left, t.right) if ast.unparse(s) != "None"]
            return sides[0] if len(sides) == 1 else t
        return t

    def field_call(self, mod, stmt):
        """The (names, kwargs) one annotated field registers, or None when it registers nothing."""
        ann = stmt.annotation
        if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
            ann = ast.parse(ann.value, mode="eval").body
        if not (isinstance(ann, ast.Subscript) and ast.unparse(ann.value).split(".")[-1] in ("A", "Annotated")):
            return None
        elts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
        raw, meta = elts[0], None
        for m in elts[1:]:
            if isinstance(m, ast.Constant) and isinstance(m.value, str):
                meta = {"help": m.value}
                break
            if isinstance(m, ast.Call) and ast.unparse(m.func).split(".")[-1] == "Arg":
                meta = {k.arg: k.value for k in m.keywords if k.arg}
                if m.args:
                    meta.setdefault("help", m.args[0])
                meta = {k: (self.value(v, mod) if isinstance(v, ast.AST) else v) for k, v in meta.items()}
                break
        if meta is None or meta.get("no_cli") is True:
            return None
        name = stmt.target.id
        cli = meta.get("cli_name") or "--" + name.replace("_", "-")
        names = [cli] + list(meta.get("aliases") or [])
        default = self.field_default(stmt, mod)
        self.fields[name] = default if default is not _MISSING else None
        kw = {"help": meta.get("help", "")}
        if cli.lstrip("-").replace("-", "_") != name:
            kw["dest"] = name
        if default is not _MISSING:
            kw["default"] = default
        if meta.get("action") is not None:
            kw["action"] = meta["action"]
            kw.update(meta.get("action_kwargs") or {})
            return names, kw
        inner = self._strip_optional(raw)
        head = ast.unparse(inner.value).split(".")[-1] if isinstance(inner, ast.Subscript) else None
        type_parser = meta.get("type_parser")
        if head == "Literal":
            vals = [self.value(e, mod) for e in getattr(inner.slice, "elts", [inner.slice])]
            kw.update(type=type_parser or _type_name(type(vals[0]).__name__ if vals else "str"), choices=meta.get("choices") or vals)
        elif head in ("list", "List") and type_parser is None:
            elem = ast.unparse(inner.slice) if isinstance(inner, ast.Subscript) else "str"
            kw.update(type=_type_name(elem), nargs=meta.get("nargs") or "+")
            if meta.get("choices"):
                kw["choices"] = meta["choices"]
        elif ast.unparse(inner) == "bool":
            kw["action"] = "store_true"
            return names, kw
        else:
            kw["type"] = type_parser or _type_name(ast.unparse(inner))
            if meta.get("choices"):
                kw["choices"] = meta["choices"]
            if meta.get("nargs"):
                kw["nargs"] = meta["nargs"]
            req = meta.get("required")
            if req is True or (req is None and default is _MISSING):
                kw["required"] = True
        if meta.get("const") is not None:
            kw["const"] = meta["const"]
        return names, kw

    def field_default(self, stmt, mod):
        v = stmt.value
        if v is None:
            return _MISSING
        if isinstance(v, ast.Call) and ast.unparse(v.func).split(".")[-1] == "field":
            kws = {k.arg: k.value for k in v.keywords}
            if "default" in kws:
                return self.value(kws["default"], mod)
            factory = ast.unparse(kws["default_factory"]) if "default_factory" in kws else None
            known = {"list": [], "dict": {}, "set": [], "tuple": []}
            if factory in known:
                return known[factory]
            return {"unresolved": factory} if factory else _MISSING
        return self.value(v, mod)

    def field_statements(self, sa):
        """Annotated field declarations of ServerArgs, in the order the record has them."""
        if "_INPUT_NAMESPACES" in sa.assigns:  # 0.5.20+: namespace classes composed in field_order
            decls = {}
            for elt in sa.assigns["_INPUT_NAMESPACES"].elts:
                m, cls = sa.find_def(elt.id)
                if cls is None:
                    raise SystemExit(f"{self.src.path}: namespace class {elt.id} not found in the sources")
                for s in cls.body:
                    if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name):
                        decls.setdefault(s.target.id, (m, s))
            order_mod = self.module("sglang.srt.arg_groups.field_order")
            frozen = list(order_mod.lookup("POSITIONAL_FIELD_ORDER")) if order_mod else []
            names = [n for n in frozen if n in decls] + [n for n in decls if n not in set(frozen)]
            out = [decls[n] for n in names]
        else:
            out = []
        _, cls = sa.find_def("ServerArgs")
        seen = {s.target.id for _, s in out}
        for s in cls.body if cls else []:
            if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.target.id not in seen:
                out.append((sa, s))
        return out

    def action_defaults(self, action_name, sa):
        """What an SGLang action class's __init__ defaults nargs/const/default to
        (DeprecatedStoreTrueAction: nargs=0, const=True, default=False)."""
        m, cls = sa.find_def(action_name)
        out = {}
        for f in cls.body if isinstance(cls, ast.ClassDef) else []:
            if isinstance(f, ast.FunctionDef) and f.name == "__init__":
                args = f.args.args[len(f.args.args) - len(f.args.defaults):]
                for a, d in zip(args, f.args.defaults):
                    if a.arg in ("nargs", "const", "default"):
                        out[a.arg] = self.value(d, m)
        return out

    def schema(self):
        sa = self.module("sglang.srt.server_args")
        _, fn = sa.find_def("ServerArgs")
        add = next((f for f in (fn.body if fn else []) if isinstance(f, ast.FunctionDef) and f.name == "add_cli_args"), None)
        if add is None:
            raise SystemExit(f"{self.src.path}: ServerArgs.add_cli_args not found; this SGLang layout is not known to the static reader")
        actions = [make_action(["-h", "--help"], {"action": "help"}, None)]
        scope = {}

        def walk(stmts):
            for s in stmts:
                if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name):
                    try:
                        scope[s.targets[0].id] = self.ev(s.value, sa, scope)
                    except (Unresolved, TypeError, ValueError, KeyError):
                        scope[s.targets[0].id] = Unresolved
                elif isinstance(s, ast.If):
                    walk(s.body)  # only add_argument calls count; state the condition changes is not followed
                elif isinstance(s, ast.Expr) and isinstance(s.value, ast.Call):
                    call, func = s.value, ast.unparse(s.value.func)
                    if func.endswith("add_cli_args_from_dataclass"):
                        for m, stmt in self.field_statements(sa):
                            fc = self.field_call(m, stmt)
                            if fc:
                                actions.append(make_action(fc[0], fc[1], lambda n: self.action_defaults(n, sa)))
                    elif func.endswith(".add_argument"):
                        names = [self.value(a, sa, scope) for a in call.args]
                        kw = {k.arg: self.value(k.value, sa, scope) for k in call.keywords if k.arg}
                        actions.append(make_action(names, kw, lambda n: self.action_defaults(n, sa)))

        walk(add.body)
        return {"sglang_version": self.version(), "method": "static", "actions": actions, "env": self.env_vars(),
                "root": os.path.abspath(self.src.path)}

    def version(self):
        """sglang/_version.py (setuptools-scm), else the dist-info METADATA next to the package."""
        m = self.module("sglang._version")
        try:
            return m.lookup("__version__")
        except (Unresolved, AttributeError):
            pass
        if self.src.zip is not None:
            metas = [n for n in self.src.names if n.startswith("sglang-") and n.endswith(".dist-info/METADATA")]
        else:
            metas = [os.path.join(d, "METADATA") for d in os.listdir(self.src.root) if d.startswith("sglang-") and d.endswith(".dist-info")]
        for meta in metas:
            for line in self.src.read(os.path.relpath(meta, self.src.root) if self.src.zip is None else meta).splitlines():
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
        return None

    def env_vars(self):
        return env_vars_from(self.module("sglang.srt.environ"))


_MISSING = object()


def _type_name(t):
    return {"str": "str", "int": "int", "float": "float"}.get(t, "str")


def make_action(names, kw, defaults_of):
    """One action entry in the dump's shape, as argparse would build it from add_argument()."""
    action = kw.get("action")
    if isinstance(action, str) and action not in _ACTION_CLASS and action != "help" and defaults_of:
        kw = {**defaults_of(action), **kw}
    help_text = kw.get("help")
    if action == "help":
        return {"option_strings": names, "dest": "help", "nargs": 0, "default": "==SUPPRESS==", "choices": None,
                "type": None, "action": "_HelpAction", "required": False, "const": None, "help": "show this help message and exit"}
    cls = _ACTION_CLASS.get(action, action)
    if action == "BooleanOptionalAction":
        names = [n for o in names for n in ([o, "--no-" + o[2:]] if o.startswith("--") else [o])]
    long = next((n for n in names if isinstance(n, str) and n.startswith("--")), names[0] if names else "")
    dest = kw.get("dest") or str(long).lstrip("-").replace("-", "_")
    if "nargs" in kw:
        nargs = kw["nargs"]
    elif action in _ZERO_ARG or action == "BooleanOptionalAction":
        nargs = 0
    else:
        nargs = None
    default = kw.get("default", {"store_true": False, "store_false": True}.get(action))
    const = kw.get("const", True if action == "store_true" else False if action == "store_false" else None)
    entry = {"option_strings": names, "dest": dest, "nargs": nargs, "default": default,
             "choices": kw.get("choices"), "type": kw.get("type"), "action": cls,
             "required": bool(kw.get("required", False)), "const": const,
             "help": help_text if isinstance(help_text, str) else None}
    if isinstance(help_text, dict):
        entry["help_unresolved"] = help_text["unresolved"]
    if "const_value" in kw:
        entry["const_value"] = kw["const_value"]
    if kw.get("error_message") is not None:
        # DeprecatedAction(error_message=...) stops the launch with it (parser.error).
        entry["error_message"] = kw["error_message"]
    return mark_deprecated(entry, kw.get("new_flag"))


_HELP_MARKS = ("[Deprecated]", "(Deprecated", "Deprecated.", "Removed.")


def mark_deprecated(entry, new_flag):
    if entry["action"].startswith("Deprecated"):
        entry["deprecated"] = True
        if new_flag:
            entry["new_flag"] = new_flag
    elif (entry["help"] or "").lstrip().startswith(_HELP_MARKS):
        entry["deprecated"] = True
    return entry


def env_vars_from(mod):
    """SGLANG_* variables environ.py defines (class Envs), and the deprecated ones it maps."""
    if mod is None:
        return None
    out = []
    _, envs = mod.find_def("Envs")
    for s in ast.walk(envs) if envs else []:
        if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name) and s.targets[0].id.isupper():
            out.append({"name": s.targets[0].id})
            for k in getattr(s.value, "keywords", []):
                if k.arg == "deprecated_name" and isinstance(k.value, ast.Constant):
                    out.append({"name": k.value.value, "deprecated": True, "replacement": s.targets[0].id})
    table = mod.assigns.get("_DEPRECATED_ENVS")
    if isinstance(table, ast.Dict):
        for k, v in zip(table.keys, table.values):
            if isinstance(k, ast.Constant):
                rep = next((x.value.value for x in getattr(v, "keywords", []) if x.arg == "replacement" and isinstance(x.value, ast.Constant)), None)
                out.append({"name": k.value, "deprecated": True, "replacement": rep})
    return out


def import_schema():
    import time

    t0 = time.perf_counter()
    import sglang
    from sglang.srt.server_args import ServerArgs

    t1 = time.perf_counter()
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    t2 = time.perf_counter()
    actions = []
    for a in parser._actions:
        entry = {"option_strings": list(a.option_strings), "dest": a.dest, "nargs": a.nargs,
                 "default": jsonable(a.default),
                 "choices": jsonable(a.choices if isinstance(a.choices, (set, frozenset)) else list(a.choices)) if a.choices is not None else None,
                 "type": getattr(a.type, "__name__", None) if a.type is not None else None,
                 "action": type(a).__name__, "required": a.required, "const": jsonable(a.const),
                 "help": a.help if isinstance(a.help, str) else None}
        if hasattr(a, "const_value"):
            entry["const_value"] = jsonable(a.const_value)
        if getattr(a, "error_message", None) is not None:
            entry["error_message"] = jsonable(a.error_message)
        actions.append(mark_deprecated(entry, getattr(a, "new_flag", None)))
    # environ.py is read the same way in both modes: statically, from the tree just imported.
    root = os.path.dirname(os.path.dirname(os.path.abspath(sglang.__file__)))
    return {"sglang_version": getattr(sglang, "__version__", None), "method": "import",
            "python": sys.version.split()[0], "actions": actions, "env": Static(root).env_vars(), "root": root,
            "timings": {"import_s": round(t1 - t0, 3), "parser_s": round(t2 - t1, 3)}}


def installed_root():
    """Where this interpreter would import sglang from, found without importing it (no torch)."""
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{sys.executable} has no sglang package on its path")
    return os.path.dirname(list(spec.submodule_search_locations)[0])


def env_reads(path, names):
    """Where the package reads each of `names` itself (os.environ[...], os.environ.get, os.getenv,
    get_bool_env_var, a module's own _env_int, ...) rather than through environ.py: {name: file}.
    Asked only for the variables environ.py does not define, so the usual read stays fast."""
    import re

    src = Sources(path)
    wanted = {n.encode() for n in names}
    call = rb"(?:environ\s*\[|\w*(?:environ|getenv|env)\w*\s*(?:\.\s*(?:get|setdefault|pop)\s*)?\()\s*[\"'](SGLANG_[A-Za-z0-9_]+)[\"']"
    rx = re.compile(call)
    if src.zip is not None:
        files = sorted(n for n in src.names if n.startswith("sglang/") and n.endswith(".py"))
        read = src.zip.read
    else:
        files = []
        for d, _, fs in os.walk(os.path.join(src.root, "sglang")):
            files += [os.path.relpath(os.path.join(d, f), src.root) for f in fs if f.endswith(".py")]
        files.sort()

        def read(rel):
            with open(os.path.join(src.root, rel), "rb") as f:
                return f.read()
    found = {}
    for rel in files:
        text = read(rel)
        if not any(w in text for w in wanted - set(found)):
            continue
        for m in rx.finditer(text):
            name = m.group(1)
            if name in wanted and name.decode() not in found:
                found[name.decode()] = rel
    return found


def schema(mode, path=None):
    """The schema as a JSON string (the embedded entry point).
    mode: "import" | "static" (path: a .whl or tree) | "installed" (static read of what this
    interpreter would import)."""
    if mode == "import":
        return json.dumps(import_schema())
    if mode == "env_reads":
        req = json.loads(path)
        return json.dumps(env_reads(req["root"], req["names"]))
    if mode == "installed":
        out = Static(installed_root()).schema()
        out["method"] = "static (the installed package)"
        return json.dumps(out)
    return json.dumps(Static(path).schema())


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "import"
    sys.stdout.write(schema(mode, sys.argv[2] if len(sys.argv) > 2 else None))


if __name__ == "__main__":
    main()
