"""How far ``toolfid run``'s arguments travel: read from the source with ``ast`` (nothing imported or run), the same
two numbers on every machine.

The path starts at ``lm_eval_toolfid/cli/run.py``'s ``cmd_run`` with its ``args`` and follows, depth first in source
order, every call that hands on an argument or a setting made of one (:meth:`Walk.carries`: a carrying name, a part
of one, a container of them, a value read from one (``.get``, ``getattr``) or converted (``int``, ``float``,
``str``, ``bool``), a package object built from them, or what a ``cli``/``run`` function makes of them; a computed result of a lower layer is that layer's data, not the arguments). A call is
followed where its target is found statically: a function or class of the same module or imported from
``lm_eval_toolfid`` (a class: its ``__init__``, or the class's module for a dataclass), ``self.method``, a method of
an object whose class is known (built here, returned by an annotated function, or an annotated parameter; a
``Protocol``: every class that has all of its methods). The walk stops where the arguments enter lm-eval
(``lm_eval.*``: model args, task metadata); with ``--through-lm-eval`` it goes on in the package's subclasses of
lm-eval's classes (lm-eval calls their methods back), every method with every parameter carrying.

Printed: the modules the arguments pass through (distinct, ``cli/run`` included), and how many times the path
goes back up to a higher layer: consecutive modules in first-visit order where the later one is in a higher
layer (``tests/test_layout.py``'s order) than the one before it — arguments handed down that come back up to
continue. ``--list`` prints the path, each module with the call that first brought the arguments there;
``--package DIR`` reads another checkout's ``lm_eval_toolfid`` (an older commit's, ``git archive``-ed).

    python scripts/run_arg_path.py [--list] [--through-lm-eval] [--package DIR]
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "lm_eval_toolfid"
LAYERS = ["core", "formats", "scoring", "cases", "prompts", "pairing", "reporting", "calibration", "engine", "serving",
          "integrations", "run", "cli"]
START = ("lm_eval_toolfid.cli.run", "cmd_run")


class Module:
    def __init__(self, name: str, tree: ast.Module) -> None:
        self.name, self.tree = name, tree
        self.defs: dict[str, ast.AST] = {n.name: n for n in tree.body
                                         if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))}
        self.imports: dict[str, tuple[str, str | None]] = {}  # local name -> (module, attribute or None)
        for node in ast.walk(tree):  # imports inside functions too
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for a in node.names:
                    self.imports[a.asname or a.name] = (node.module, a.name)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    self.imports[a.asname or a.name.split(".")[0]] = (a.name, None)


def load(pkg: Path = PKG) -> dict[str, Module]:
    mods = {}
    for path in sorted(pkg.rglob("*.py")):
        parts = path.relative_to(pkg.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = Module(name, ast.parse(path.read_text(encoding="utf-8")))
    return mods


def names_in(node: ast.AST | None) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} if node is not None else set()


CONTAINERS = {"dict", "list", "tuple", "set", "frozenset", "sorted", "replace"}
READS = {"get", "items", "values", "keys", "copy", "setdefault", "pop"}
AS_GIVEN = {"getattr", "int", "float", "str", "bool"}
"""Builtins whose result is the value they are given (read or converted): an argument stays one through them."""
SETTING_LAYERS = {"cli", "run"}
"""The layers whose functions turn arguments into settings (what they return carries the arguments on)."""


def layer(module: str) -> int:
    return LAYERS.index(module.split(".")[1])


class Walk:
    """The depth-first walk of the arguments from `cmd_run`: the modules in first-visit order (:attr:`order`)."""

    def __init__(self, mods: dict[str, Module], through_lm_eval: bool = False) -> None:
        self.mods, self.through_lm_eval = mods, through_lm_eval
        self.order: list[str] = []
        self.via: dict[str, str] = {}
        """module -> the call that first brought the arguments there (caller -> callee)."""
        self.current = "(start)"
        self.seen: set[tuple[str, str, frozenset[str]]] = set()
        self.classes = {(m.name, n): d for m in mods.values() for n, d in m.defs.items() if isinstance(d, ast.ClassDef)}

    # --- resolution -----------------------------------------------------------------------------------------------
    def symbol(self, mod: Module, name: str) -> tuple[str, str] | None:
        """(module, top-level name) that ``name`` means in ``mod`` (package symbols only)."""
        if name in mod.defs:
            return mod.name, name
        target = mod.imports.get(name)
        if target and target[1] and target[0].startswith("lm_eval_toolfid"):
            module, attr = target
            if module in self.mods and attr in self.mods[module].defs:
                return module, attr
            if f"{module}.{attr}" in self.mods:
                return None  # a module, not a symbol
            if module in self.mods and attr in self.mods[module].imports:  # re-exported
                return self.symbol(self.mods[module], attr)
        return None

    def is_protocol(self, cls: ast.ClassDef) -> bool:
        return any(isinstance(b, ast.Name) and b.id == "Protocol" for b in cls.bases)

    def methods(self, cls: ast.ClassDef) -> dict[str, ast.FunctionDef]:
        return {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}

    def implementations(self, key: tuple[str, str]) -> list[tuple[str, str]]:
        cls = self.classes[key]
        if not self.is_protocol(cls):
            return [key]
        need = set(self.methods(cls))
        return [k for k, c in sorted(self.classes.items()) if k != key and not self.is_protocol(c)
                and need <= set(self.methods(c))]

    def annotation_class(self, mod: Module, ann: ast.AST | None) -> tuple[str, str] | None:
        """The package class an annotation names (the first one `ast.walk` meets; quoted annotations too)."""
        if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
            try:
                ann = ast.parse(ann.value, mode="eval")
            except SyntaxError:
                return None
        names = [n.id for n in ast.walk(ann) if isinstance(n, ast.Name)] if ann is not None else []
        for name in names:
            sym = self.symbol(mod, name)
            if sym and sym in self.classes:
                return sym
        return None

    def lm_eval_subclasses(self) -> list[tuple[str, str]]:
        out = []
        for (module, name), cls in sorted(self.classes.items()):
            mod = self.mods[module]
            for base in cls.bases:
                head = base.id if isinstance(base, ast.Name) else None
                target = mod.imports.get(head or "")
                if target and target[0].split(".")[0] == "lm_eval":
                    out.append((module, name))
                    break
        return out

    def carries(self, mod: Module, expr: ast.AST | None, carrying: set[str]) -> bool:
        """``expr`` is an argument or a setting built from them: a carrying name, a part of one (attribute, item,
        ``*``/``**``), a container or choice of them, a package object built from them, a container built from them,
        a value read from one (``.get``, ``.items``..., ``getattr``) or converted (``float(args.timeout)``). A
        computed result (another call, arithmetic, a message)
        is the function's own data, not the arguments."""
        if expr is None:
            return False
        if isinstance(expr, ast.Name):
            return expr.id in carrying
        if isinstance(expr, (ast.Attribute, ast.Subscript, ast.Starred)):
            return self.carries(mod, expr.value, carrying)
        if isinstance(expr, ast.Dict):
            return any(self.carries(mod, x, carrying) for x in [*expr.keys, *expr.values] if x is not None)
        if isinstance(expr, (ast.List, ast.Tuple, ast.Set)):
            return any(self.carries(mod, x, carrying) for x in expr.elts)
        if isinstance(expr, ast.IfExp):
            return self.carries(mod, expr.body, carrying) or self.carries(mod, expr.orelse, carrying)
        if isinstance(expr, ast.BoolOp):
            return any(self.carries(mod, x, carrying) for x in expr.values)
        if isinstance(expr, ast.Call):
            func = expr.func
            sym = self.symbol(mod, func.id) if isinstance(func, ast.Name) else None
            built = isinstance(func, ast.Name) and (func.id in CONTAINERS or sym in self.classes or (
                sym is not None and sym[0].split(".")[1] in SETTING_LAYERS))
            if isinstance(func, ast.Attribute) and func.attr in READS and self.carries(mod, func.value, carrying):
                return True
            if isinstance(func, ast.Name) and func.id in AS_GIVEN and expr.args and self.carries(mod, expr.args[0],
                                                                                              carrying):
                return True  # getattr(args, "x"), float(args.timeout): the argument itself
            given = [*expr.args, *(k.value for k in expr.keywords)]
            return built and any(self.carries(mod, a, carrying) for a in given)
        return False

    # --- the walk ---------------------------------------------------------------------------------------------------
    def enter(self, module: str, func: ast.FunctionDef | ast.AsyncFunctionDef, cls: ast.ClassDef | None,
              carrying: set[str]) -> None:
        key = (module, f"{cls.name + '.' if cls else ''}{func.name}", frozenset(carrying))
        if key in self.seen:
            return
        self.seen.add(key)
        if module not in self.order:
            self.order.append(module)
            self.via[module] = f"{self.current} -> {key[1]}"
        caller, self.current = self.current, f"{module.removeprefix('lm_eval_toolfid.')}.{key[1]}"
        mod = self.mods[module]
        carrying = set(carrying)
        types: dict[str, tuple[str, str]] = {}
        for a in func.args.args + func.args.kwonlyargs:
            found = self.annotation_class(mod, a.annotation)
            if found:
                types[a.arg] = found
        changed = True
        while changed:  # names assigned from carrying expressions carry
            changed = False
            for node in ast.walk(func):
                targets, value = [], None
                if isinstance(node, ast.Assign):
                    targets, value = node.targets, node.value
                elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) and node.value is not None:
                    targets, value = [node.target], node.value
                elif isinstance(node, (ast.For, ast.comprehension)):
                    targets, value = [node.target], node.iter
                elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                    targets, value = [node.optional_vars], node.context_expr
                if value is None or not self.carries(mod, value, carrying):
                    continue
                for t in targets:
                    new = {n.id for n in ast.walk(t) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
                    if isinstance(t, ast.Attribute):  # self.x = carrying: the object carries
                        new |= names_in(t.value)
                    new -= carrying
                    if new:
                        carrying |= new
                        changed = True
                    if isinstance(t, ast.Name) and isinstance(value, ast.Call):
                        made = self.made_by(mod, value, cls)
                        if made:
                            types[t.id] = made
        calls = sorted((n for n in ast.walk(func) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset))
        for node in calls:  # in source order
            self.call(mod, node, cls, carrying, types)
        self.current = caller

    def made_by(self, mod: Module, call: ast.Call, cls: ast.ClassDef | None) -> tuple[str, str] | None:
        """The class of what ``call`` returns, where known."""
        if isinstance(call.func, ast.Name):
            sym = self.symbol(mod, call.func.id)
            if sym in self.classes:
                return sym
            if sym is not None:
                fn = self.mods[sym[0]].defs[sym[1]]
                if isinstance(fn, ast.FunctionDef):
                    return self.annotation_class(self.mods[sym[0]], fn.returns)
        return None

    def call(self, mod: Module, call: ast.Call, cls: ast.ClassDef | None, carrying: set[str],
             types: dict[str, tuple[str, str]]) -> None:
        args = [self.carries(mod, a, carrying) for a in call.args]
        kwargs = {k.arg: self.carries(mod, k.value, carrying) for k in call.keywords}
        receiver = isinstance(call.func, ast.Attribute) and self.carries(mod, call.func.value, carrying)
        if not receiver and not any(args) and not any(kwargs.values()):
            return
        func = call.func
        targets: list[tuple[str, ast.FunctionDef | None, ast.ClassDef | None, bool]] = []  # module, fn, class, method
        if isinstance(func, ast.Name):
            sym = self.symbol(mod, func.id)
            target = mod.imports.get(func.id)
            if sym in self.classes:
                targets.append(self.init_of(sym))
            elif sym is not None:
                fn = self.mods[sym[0]].defs[sym[1]]
                targets.append((sym[0], fn, None, False))  # type: ignore[arg-type]
            elif target and target[0].split(".")[0] == "lm_eval":
                self.into_lm_eval()
        elif isinstance(func, ast.Attribute):
            base = func.value
            if isinstance(base, ast.Name) and base.id == "self" and cls is not None:
                fn = self.methods(cls).get(func.attr)
                if fn is not None:
                    targets.append((mod.name, fn, cls, True))
            elif isinstance(base, ast.Name) and base.id in types:
                for key in self.implementations(types[base.id]):
                    fn = self.methods(self.classes[key]).get(func.attr)
                    if fn is not None:
                        targets.append((key[0], fn, self.classes[key], True))
            elif isinstance(base, ast.Name) and base.id in mod.imports:
                module = mod.imports[base.id][0] if mod.imports[base.id][1] is None else \
                    f"{mod.imports[base.id][0]}.{mod.imports[base.id][1]}"
                if module in self.mods and func.attr in self.mods[module].defs:
                    sym = (module, func.attr)
                    targets.append(self.init_of(sym) if sym in self.classes else
                                   (module, self.mods[module].defs[func.attr], None, False))  # type: ignore[arg-type]
                elif module.split(".")[0] == "lm_eval":
                    self.into_lm_eval()
        for module, fn, owner, method in targets:
            if fn is None:  # a dataclass: the values land in its module
                if module not in self.order:
                    self.order.append(module)
                    self.via[module] = f"{self.current} -> {owner.name if owner else '?'}"
                continue
            self.enter(module, fn, owner, self.params(fn, args, kwargs, method or owner is not None, receiver))

    def init_of(self, key: tuple[str, str]) -> tuple[str, ast.FunctionDef | None, ast.ClassDef, bool]:
        cls = self.classes[key]
        return key[0], self.methods(cls).get("__init__"), cls, True

    def params(self, fn: ast.FunctionDef, args: list[bool], kwargs: dict[str | None, bool], bound: bool,
               receiver: bool) -> set[str]:
        names = [a.arg for a in fn.args.args]
        if bound and names:
            selfname, names = names[0], names[1:]
        else:
            selfname = None
        out = {selfname} if receiver and selfname else set()
        for i, used in enumerate(args):
            if used:
                out |= {names[i]} if i < len(names) else ({fn.args.vararg.arg} if fn.args.vararg else set())
        for key, used in kwargs.items():
            if used:
                if key is None or key not in names + [a.arg for a in fn.args.kwonlyargs]:
                    out |= set(names) | {a.arg for a in fn.args.kwonlyargs}
                else:
                    out.add(key)
        if selfname and (out - {selfname}) and fn.name == "__init__":
            out.add(selfname)
        return out

    def into_lm_eval(self) -> None:
        if not self.through_lm_eval:
            return
        for key in self.lm_eval_subclasses():
            cls = self.classes[key]
            for fn in self.methods(cls).values():
                self.enter(key[0], fn, cls, {a.arg for a in fn.args.args + fn.args.kwonlyargs})


def measure(pkg: Path = PKG, through_lm_eval: bool = False) -> tuple[list[str], int, dict[str, str]]:
    mods = load(pkg)
    walk = Walk(mods, through_lm_eval)
    module, name = START
    walk.enter(module, mods[module].defs[name], None, {"args"})  # type: ignore[arg-type]
    path = walk.order
    ups = sum(1 for a, b in zip(path, path[1:]) if layer(b) > layer(a))
    return path, ups, walk.via


def main(argv: list[str]) -> int:
    pkg = Path(argv[argv.index("--package") + 1]) if "--package" in argv else PKG
    path, ups, via = measure(pkg, "--through-lm-eval" in argv)
    if "--list" in argv:
        for a, b in zip([None, *path], path):
            mark = "  ^ " if a is not None and layer(b) > layer(a) else "    "
            print(f"{mark}{b.removeprefix('lm_eval_toolfid.'):<40} {via[b]}")
    print(f"modules: {len(path)}")
    print(f"back up to a higher layer: {ups}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
