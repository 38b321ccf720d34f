#!/usr/bin/env python3
"""The layout check: no import circle between files, no file over 600 lines.

    scripts/check-layout.py              check the repository
    scripts/check-layout.py --self-test  check that the check can fail

For each Rust source root it builds the crate's module tree from `mod x;`
declarations (`lib.rs`/`main.rs`/`mod.rs`, and `foo.rs` beside `foo/`),
then one graph of files: an arrow from a file to each file it names in a
path, whether in a `use` (grouped trees included) or inline in code. A
path starts at `crate::`, `super::`, `self::`, at a module the file
declares, or at a module it imported; it names the deepest file it
reaches, so an item resolves to the file it is in.

Re-exports: a name a module re-exports from this crate (`pub use x::Y;`
in a `mod.rs` or `lib.rs`) is followed to the file that defines it, and
another crate's item stops at the file that re-exports it. A `pub use` is
itself no arrow, unless the module's own code uses the name: a module list
re-exporting its children would otherwise be in a circle with every child
that imports through it. Nor is `mod x;`: a module list is not an import.

Test code (`#[cfg(test)]` items, `tests.rs`, `tests/`) is left out. Each
circle is printed as `a.rs -> b.rs -> a.rs` with the paths that draw each
arrow.

Needs only the standard library.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import deque
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# The Rust crates whose files must not import each other in a circle.
RUST_ROOTS = ("plugin/src", "plugin/abi/src", "runtime/src", "host/src", "python/src")

# Python modules held to the same file length as the Rust ones.
PYTHON_GLOBS = ("python/dfx_engine/*.py",)

MAX_LINES = 600

# How many of the paths that draw one arrow are printed.
NAMES_SHOWN = 4


@dataclass(frozen=True)
class Token:
    """One Rust token: an identifier, a keyword or one punctuation mark."""

    text: str
    line: int


def _skip_block_comment(src: str, i: int) -> int:
    """The index after the block comment opening at `i` (they nest)."""
    depth = 0
    n = len(src)
    while i < n:
        if src.startswith("/*", i):
            depth += 1
            i += 2
        elif src.startswith("*/", i):
            depth -= 1
            i += 2
            if depth == 0:
                return i
        else:
            i += 1
    return n


def _skip_string(src: str, i: int) -> int:
    """The index after the quoted string whose opening quote is at `i`."""
    n = len(src)
    i += 1
    while i < n:
        if src[i] == "\\":
            i += 2
        elif src[i] == '"':
            return i + 1
        else:
            i += 1
    return n


def _raw_string_end(src: str, i: int) -> int | None:
    """The index after a raw string whose `r` is at `i`, or None if not one."""
    j = i + 1
    while j < len(src) and src[j] == "#":
        j += 1
    if j >= len(src) or src[j] != '"':
        return None
    closing = '"' + "#" * (j - i - 1)
    end = src.find(closing, j + 1)
    return len(src) if end < 0 else end + len(closing)


def _is_ident_start(c: str) -> bool:
    return c.isalpha() or c == "_"


def _is_ident_char(c: str) -> bool:
    return c.isalnum() or c == "_"


def tokenize(src: str) -> list[Token]:
    """The tokens of Rust source `src`, without comments and literals.

    Strings, characters and numbers are dropped (a path in a string is no
    import); lifetimes too. `::` is one token; other marks are one each.
    """
    tokens: list[Token] = []
    i = 0
    n = len(src)
    line = 1
    while i < n:
        c = src[i]
        if c == "\n":
            line += 1
            i += 1
            continue
        if c.isspace():
            i += 1
            continue
        start = i
        if src.startswith("//", i):
            end = src.find("\n", i)
            i = n if end < 0 else end
        elif src.startswith("/*", i):
            i = _skip_block_comment(src, i)
        elif c == '"':
            i = _skip_string(src, i)
        elif c in "bc" and i + 1 < n and src[i + 1] == '"':
            i = _skip_string(src, i + 1)
        elif c in "bc" and src.startswith("r", i + 1) and _raw_string_end(src, i + 1):
            i = _raw_string_end(src, i + 1) or n
        elif c == "r" and _raw_string_end(src, i) is not None:
            i = _raw_string_end(src, i) or n
        elif c == "b" and src.startswith("'", i + 1):
            i = _skip_char(src, i + 1)
        elif c == "'":
            i = _skip_char(src, i)
        elif (
            c == "r"
            and src.startswith("#", i + 1)
            and _is_ident_start(src[i + 2 : i + 3] or " ")
        ):
            # A raw identifier, `r#type`: the identifier is `type`.
            j = i + 2
            while j < n and _is_ident_char(src[j]):
                j += 1
            tokens.append(Token(src[i + 2 : j], line))
            i = j
        elif _is_ident_start(c):
            j = i
            while j < n and _is_ident_char(src[j]):
                j += 1
            tokens.append(Token(src[i:j], line))
            i = j
        elif c.isdigit():
            j = i
            while j < n and (
                _is_ident_char(src[j])
                or (src[j] == "." and j + 1 < n and src[j + 1].isdigit())
            ):
                j += 1
            i = j
        elif src.startswith("::", i):
            tokens.append(Token("::", line))
            i += 2
        else:
            tokens.append(Token(c, line))
            i += 1
        line += src.count("\n", start + 1, i) if i > start + 1 else 0
    return tokens


def _skip_char(src: str, i: int) -> int:
    """The index after a character literal at `i`, or after a lifetime."""
    n = len(src)
    if i + 1 < n and src[i + 1] == "\\":
        end = src.find("'", i + 3)
        return n if end < 0 else end + 1
    if i + 2 < n and src[i + 2] == "'":
        return i + 3
    # A lifetime or a label: `'a`, `'static`.
    j = i + 1
    while j < n and _is_ident_char(src[j]):
        j += 1
    return j


OPEN = {"(": ")", "[": "]", "{": "}"}


def matching(tokens: list[Token], i: int) -> int:
    """The index of the bracket closing the one at `i`."""
    depth = 0
    for j in range(i, len(tokens)):
        t = tokens[j].text
        if t in OPEN:
            depth += 1
        elif t in (")", "]", "}"):
            depth -= 1
            if depth == 0:
                return j
    return len(tokens) - 1


def item_end(tokens: list[Token], i: int) -> int:
    """The index of the last token of the item starting at `i`.

    An item ends at a `;` outside brackets, or at the `}` closing its
    first top-level block (a module, function, impl or struct body).
    """
    j = i
    while j < len(tokens):
        t = tokens[j].text
        if t == ";":
            return j
        if t == "{":
            return matching(tokens, j)
        if t in ("(", "["):
            j = matching(tokens, j)
        j += 1
    return len(tokens) - 1


def is_test_cfg(attr: list[Token]) -> bool:
    """Whether attribute tokens `attr` (inside `#[...]`) are a test-only cfg."""
    texts = [t.text for t in attr]
    if not texts or texts[0] != "cfg":
        return False
    # `cfg(test)` or `cfg(all(test, ...))`; `cfg(not(test))` is not test code.
    return texts[:4] == ["cfg", "(", "test", ")"] or texts[:5] == [
        "cfg",
        "(",
        "all",
        "(",
        "test",
    ]


@dataclass
class UsePath:
    """One path a `use` or the code names, with the scope it appears in."""

    segments: list[str]
    # The name the path is bound to by a `use` (its last segment or `as`),
    # or None for a path in code or a glob.
    alias: str | None
    written: str
    line: int
    # A `pub use` (of any visibility): a re-export, not an import.
    public: bool = False


@dataclass
class Scope:
    """A module inside one file: the file's own, or an inline `mod x { }`."""

    path: list[str]
    declared: list[str] = field(default_factory=list)
    inline: dict[str, Scope] = field(default_factory=dict)
    uses: list[UsePath] = field(default_factory=list)
    paths: list[UsePath] = field(default_factory=list)
    # Every name the code uses (outside `use` declarations and attributes).
    names: set[str] = field(default_factory=set)


def parse_use_tree(tokens: list[Token], line: int) -> list[UsePath]:
    """The paths of one `use` tree (the tokens between `use` and `;`)."""
    out: list[UsePath] = []

    def tree(i: int, prefix: list[str]) -> int:
        segments = list(prefix)
        while i < len(tokens):
            t = tokens[i].text
            if t == "{":
                close = matching(tokens, i)
                j = i + 1
                while j < close:
                    j = tree(j, segments)
                    if j < close and tokens[j].text == ",":
                        j += 1
                return close + 1
            if t == "*":
                out.append(UsePath([*segments, "*"], None, "::".join(segments), line))
                return i + 1
            if t == "::":
                if not segments:
                    # `use ::name`: always another crate.
                    segments.append("::")
                i += 1
                continue
            if t in (",", "}"):
                break
            if t == "as":
                alias = tokens[i + 1].text if i + 1 < len(tokens) else "_"
                out.append(_bound(segments, alias, line))
                return i + 2
            segments.append(t)
            i += 1
        if segments != prefix:
            out.append(_bound(segments, None, line))
        return i

    tree(0, [])
    return out


def _bound(segments: list[str], alias: str | None, line: int) -> UsePath:
    """The path of a `use` leaf, `self` meaning the path before it."""
    if segments and segments[-1] == "self":
        segments = segments[:-1]
    name = alias if alias is not None else (segments[-1] if segments else "_")
    return UsePath(segments, name, "::".join(segments), line)


def parse_file(path: Path) -> Scope:
    """The module scope of one source file, with its inline modules."""
    tokens = tokenize(path.read_text(encoding="utf-8"))
    root = Scope([])
    _parse_scope(tokens, 0, len(tokens), root)
    return root


def _parse_scope(tokens: list[Token], start: int, end: int, scope: Scope) -> None:
    """Fill `scope` from the tokens in `[start, end)`."""
    i = start
    test_item = False
    while i < end:
        t = tokens[i].text
        if t == "#" and i + 1 < end and tokens[i + 1].text in ("[", "!"):
            bracket = i + 1 if tokens[i + 1].text == "[" else i + 2
            close = matching(tokens, bracket)
            if tokens[i + 1].text == "[" and is_test_cfg(tokens[bracket + 1 : close]):
                test_item = True
            i = close + 1
            continue
        if test_item:
            # The whole item is test code: no module, no import.
            i = item_end(tokens, i) + 1
            test_item = False
            continue
        if t == "mod" and i + 2 < end and tokens[i + 2].text in (";", "{"):
            name = tokens[i + 1].text
            if tokens[i + 2].text == ";":
                scope.declared.append(name)
                i += 3
            else:
                close = matching(tokens, i + 2)
                child = Scope([*scope.path, name])
                scope.inline[name] = child
                _parse_scope(tokens, i + 3, close, child)
                i = close + 1
            continue
        if t == "use" and (i == 0 or tokens[i - 1].text != "::"):
            semi = i
            while semi < end and tokens[semi].text != ";":
                semi += 1
            found = parse_use_tree(tokens[i + 1 : semi], tokens[i].line)
            if _is_public(tokens, i):
                for use in found:
                    use.public = True
            scope.uses.extend(found)
            i = semi + 1
            continue
        if _ident(t):
            scope.names.add(t)
        if _ident(t) and i + 1 < end and tokens[i + 1].text == "::":
            before = tokens[i - 1].text if i > 0 else ""
            # Not the middle of a longer path, a method's turbofish
            # (`x.f::<T>()`), a macro's `$crate`, or `pub(in path)`.
            if before not in ("::", ".", "$", "in"):
                segments = [t]
                j = i + 1
                while (
                    j + 1 < end
                    and tokens[j].text == "::"
                    and _ident(tokens[j + 1].text)
                ):
                    segments.append(tokens[j + 1].text)
                    j += 2
                scope.paths.append(
                    UsePath(segments, None, "::".join(segments), tokens[i].line)
                )
                i = j
                continue
        i += 1


def _is_public(tokens: list[Token], i: int) -> bool:
    """Whether the `use` at `i` is preceded by a visibility (`pub`, `pub(x)`)."""
    j = i - 1
    if j >= 0 and tokens[j].text == ")":
        while j >= 0 and tokens[j].text != "(":
            j -= 1
        j -= 1
    return j >= 0 and tokens[j].text == "pub"


def _ident(text: str) -> bool:
    return _is_ident_start(text[0])


@dataclass
class Module:
    """A module of a crate's tree, and the file it is written in."""

    file: Path
    scope: Scope
    children: dict[str, Module] = field(default_factory=dict)
    aliases: dict[str, list[str]] = field(default_factory=dict)
    # What each `pub use` re-exports: the absolute path it names, or None
    # for an item of another crate.
    reexports: dict[str, list[str] | None] = field(default_factory=dict)
    # Modules whose items a `pub use x::*` re-exports.
    globs: list[list[str]] = field(default_factory=list)


def is_test_file(path: Path, src: Path) -> bool:
    """Whether `path` holds only tests: a `tests.rs`, or a file in `tests/`.

    Judged below the source folder `src`, so a repository checked out
    under a folder named `tests` is not all tests.
    """
    inside = path.relative_to(src)
    return inside.name == "tests.rs" or "tests" in inside.parts[:-1]


def child_file(parent: Path, name: str) -> Path | None:
    """The file of module `name` declared in file `parent`, if it exists."""
    if parent.name in ("lib.rs", "main.rs", "mod.rs"):
        base = parent.parent
    else:
        base = parent.parent / parent.stem
    for candidate in (base / f"{name}.rs", base / name / "mod.rs"):
        if candidate.is_file():
            return candidate
    return None


def build_tree(root_file: Path, scopes: dict[Path, Scope]) -> Module:
    """The module tree of the crate rooted at `root_file`."""

    def module(file: Path, scope: Scope) -> Module:
        node = Module(file, scope)
        for name, inline in scope.inline.items():
            node.children[name] = module(file, inline)
        if scope is scopes[file]:
            # Only a file's own scope declares files (an inline module's
            # `mod x;` would look in a folder named after it: none here).
            for name in scope.declared:
                path = child_file(file, name)
                if path is None or is_test_file(path, root_file.parent):
                    continue
                if path not in scopes:
                    scopes[path] = parse_file(path)
                node.children[name] = module(path, scopes[path])
        return node

    if root_file not in scopes:
        scopes[root_file] = parse_file(root_file)
    return module(root_file, scopes[root_file])


def walk(root: Module) -> list[tuple[list[str], Module]]:
    """Every module of the tree with its absolute path, parents first."""
    out: list[tuple[list[str], Module]] = []
    stack: list[tuple[list[str], Module]] = [([], root)]
    while stack:
        path, node = stack.pop()
        out.append((path, node))
        for name, child in sorted(node.children.items(), reverse=True):
            stack.append(([*path, name], child))
    return out


def absolute(here: list[str], node: Module, segments: list[str]) -> list[str] | None:
    """The absolute module path `segments` names in module `here`.

    None when the path leaves the crate (another crate, std, a local
    variable's field path) or cannot be read.
    """
    if not segments or segments[0] == "::":
        return None
    first = segments[0]
    rest = segments[1:]
    if first == "crate":
        return rest
    if first == "self":
        return [*here, *rest]
    if first == "super":
        base = list(here)
        while segments and segments[0] == "super":
            if not base:
                return None
            base.pop()
            segments = segments[1:]
        return [*base, *segments]
    if first in node.children:
        return [*here, *segments]
    if first in node.aliases:
        return [*node.aliases[first], *rest]
    return None


def deepest(root: Module, segments: list[str]) -> tuple[Module, int]:
    """The deepest module `segments` reaches, and how many it consumed."""
    node = root
    used = 0
    for seg in segments:
        child = node.children.get(seg)
        if child is None:
            break
        node = child
        used += 1
    return node, used


# An arrow between two files, and the paths written that draw it.
Edges = dict[Path, dict[Path, set[str]]]


def bind_uses(root: Module, modules: list[tuple[list[str], Module]]) -> None:
    """Record what each module's `use`s bind: module aliases, re-exports."""
    # Twice, so that chains resolve (`use crate::a; use a::b;`).
    for _ in range(2):
        for here, node in modules:
            for use in node.scope.uses:
                target = absolute(here, node, use.segments)
                if use.public and use.segments[-1:] == ["*"]:
                    if target is not None:
                        node.globs.append(target[:-1])
                    continue
                if use.alias is None or use.alias == "_":
                    continue
                if use.public:
                    node.reexports[use.alias] = target
                if target is not None:
                    _, used = deepest(root, target)
                    if used == len(target):
                        node.aliases[use.alias] = target


def file_of(root: Module, target: list[str], hops: int = 0) -> Module:
    """The module whose file defines what `target` names.

    A name a module re-exports from this crate is followed to the file it
    comes from: the module list in a `mod.rs` is not where the item lives.
    An item of another crate stops at the file that re-exports it.
    """
    node, used = deepest(root, target)
    if used == len(target) or hops > 16:
        return node
    name = target[used]
    if name in node.reexports:
        source = node.reexports[name]
        if source is None:
            # Another crate's item: the file it is taken from is this one.
            return node
        return file_of(root, [*source, *target[used + 1 :]], hops + 1)
    for glob in node.globs:
        inner, depth = deepest(root, glob)
        if depth == len(glob) and (name in inner.children or name in inner.reexports):
            return file_of(root, [*glob, *target[used:]], hops + 1)
    return node


def crate_edges(root_file: Path, scopes: dict[Path, Scope], edges: Edges) -> None:
    """Add the arrows of the crate rooted at `root_file` to `edges`."""
    root = build_tree(root_file, scopes)
    modules = walk(root)
    bind_uses(root, modules)
    for here, node in modules:
        # A `pub use` is a re-export: it draws an arrow only for a path
        # that goes through it (followed in `file_of`), or every module
        # list that re-exports a child would be in a circle with it; unless
        # the module's own code uses the name too.
        imports = [
            u
            for u in node.scope.uses
            if not u.public or (u.alias is not None and u.alias in node.scope.names)
        ]
        for use in [*imports, *node.scope.paths]:
            segments = [s for s in use.segments if s != "*"]
            target = absolute(here, node, segments)
            if target is None:
                continue
            reached = file_of(root, target)
            if reached.file != node.file:
                edges.setdefault(node.file, {}).setdefault(reached.file, set()).add(
                    use.written
                )


def crate_roots(src: Path) -> list[Path]:
    """The crate roots in a source folder: `lib.rs`, `main.rs`, `bin/*.rs`."""
    roots = [src / name for name in ("lib.rs", "main.rs") if (src / name).is_file()]
    roots.extend(sorted((src / "bin").glob("*.rs")))
    return roots


def strongly_connected(edges: Edges) -> list[list[Path]]:
    """The graph's strongly connected components of two files or more."""
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    on_stack: set[Path] = set()
    stack: list[Path] = []
    found: list[list[Path]] = []
    counter = 0
    nodes = sorted(set(edges) | {t for targets in edges.values() for t in targets})
    for start in nodes:
        if start in index:
            continue
        # Tarjan's algorithm without recursion: (node, its targets left).
        work: list[tuple[Path, list[Path]]] = []
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        work.append((start, sorted(edges.get(start, {}))))
        while work:
            node, targets = work[-1]
            if targets:
                target = targets.pop(0)
                if target not in index:
                    index[target] = low[target] = counter
                    counter += 1
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, sorted(edges.get(target, {}))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[Path] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def shortest_cycle(edges: Edges, start: Path, within: set[Path]) -> list[Path]:
    """A shortest circle from `start` back to it, inside `within`."""
    previous: dict[Path, Path] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for target in sorted(edges.get(node, {})):
            if target not in within:
                continue
            if target == start:
                path = [node]
                while path[-1] != start:
                    path.append(previous[path[-1]])
                return [*reversed(path), start]
            if target not in previous:
                previous[target] = node
                queue.append(target)
    return []


def circles(edges: Edges, base: Path) -> list[str]:
    """Each import circle as text: its files, then circles covering them."""
    out: list[str] = []

    def name(p: Path) -> str:
        return p.relative_to(base).as_posix()

    for component in strongly_connected(edges):
        members = set(component)
        out.append(
            f"import circle of {len(component)} files: "
            + ", ".join(name(p) for p in component)
        )
        seen: set[tuple[Path, ...]] = set()
        for start in component:
            cycle = shortest_cycle(edges, start, members)
            # One circle once, whichever file it was found from.
            turn = cycle.index(min(cycle[:-1]))
            key = tuple(cycle[turn:-1] + cycle[:turn])
            if key in seen:
                continue
            seen.add(key)
            out.append("  " + " -> ".join(name(p) for p in cycle))
            for a, b in pairwise(cycle):
                names = sorted(edges[a][b])
                shown = ", ".join(names[:NAMES_SHOWN])
                more = len(names) - NAMES_SHOWN
                tail = f" (and {more} more)" if more > 0 else ""
                out.append(f"      {name(a)} -> {name(b)}: {shown}{tail}")
    return out


def long_files(base: Path, roots: list[str], globs: list[str]) -> list[str]:
    """Each non-test source file over the line limit, as text."""
    files: list[Path] = []
    for root in roots:
        src = base / root
        files.extend(p for p in src.rglob("*.rs") if not is_test_file(p, src))
    for pattern in globs:
        files.extend(p for p in base.glob(pattern) if not p.name.startswith("test_"))
    out = []
    for path in sorted(files):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES:
            out.append(f"{path.relative_to(base).as_posix()}: {lines} lines")
    return out


def check(base: Path, roots: list[str], globs: list[str]) -> list[str]:
    """Every layout problem under `base`, as lines of text; none when clean."""
    problems: list[str] = []
    for root in roots:
        src = base / root
        if not src.is_dir():
            problems.append(f"{root}: no such source folder")
            continue
        edges: Edges = {}
        scopes: dict[Path, Scope] = {}
        for root_file in crate_roots(src):
            crate_edges(root_file, scopes, edges)
        found = circles(edges, base)
        if found:
            problems.append(f"{root}:")
            problems.extend(found)
    over = long_files(base, roots, globs)
    if over:
        problems.append(f"files over {MAX_LINES} lines:")
        problems.extend("  " + line for line in over)
    return problems


def _write(base: Path, files: dict[str, str]) -> None:
    """Write each of `files` (path under `base`: text), folders made."""
    for name, text in files.items():
        path = base / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


class SelfTestError(Exception):
    """The check missed what the self-test planted, or saw what was not."""


def _expect(holds: bool, found: str) -> None:
    """Fail the self-test unless `holds`, showing what the check printed."""
    if not holds:
        raise SelfTestError(
            f"check-layout self-test failed; the check printed:\n{found}"
        )


def _found(base: Path, root: str) -> str:
    return "\n".join(check(base, [root], []))


def self_test() -> None:
    """Check the check: known circles and a long file found, clean trees pass."""
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        # A circle drawn by a grouped `use` one way and an inline
        # `super::super::` path the other; test code and a commented or
        # quoted path that would close more circles, and must not.
        _write(
            base,
            {
                "knot/src/lib.rs": "pub mod config;\npub mod exchange;\n"
                "pub mod other;\n#[cfg(test)]\nmod tests;\n",
                "knot/src/config.rs": "// crate::other::Far in a comment.\n"
                "use crate::{exchange::{reader::{Split, self as r}}, other};\n"
                'const S: &str = "crate::other::Far";\npub struct Keys;\n',
                "knot/src/exchange/mod.rs": "pub mod reader;\n",
                "knot/src/exchange/reader.rs": "pub struct Split;\n"
                "fn keys() -> super::super::config::Keys { todo!() }\n"
                "#[cfg(test)]\nmod tests { use crate::other::Far; }\n",
                "knot/src/tests.rs": "use crate::config::Keys;\n",
                "knot/src/other.rs": "pub struct Far;\n" + "\n" * MAX_LINES,
            },
        )
        text = _found(base, "knot/src")
        knot = "knot/src/config.rs -> knot/src/exchange/reader.rs -> knot/src/config.rs"
        _expect(knot in text, text)
        _expect("exchange::reader::Split" in text, text)
        _expect("super::super::config::Keys" in text, text)
        _expect("import circle of 2 files" in text, text)
        _expect(f"knot/src/other.rs: {MAX_LINES + 1} lines" in text, text)

        # Module lists that re-export their children, children importing
        # through them: no circle.
        clean = {
            "clean/src/lib.rs": "pub mod scheduler;\npub mod spec;\n"
            "pub use scheduler::Graph;\npub use spec::Spec;\n"
            "pub use other_crate::Plugin;\n",
            "clean/src/spec.rs": "pub struct Spec;\n",
            "clean/src/scheduler/mod.rs": "mod graph;\npub use graph::Graph;\n"
            "use crate::Spec;\nfn f(_: crate::Plugin) {}\n",
            "clean/src/scheduler/graph.rs": "use crate::spec::Spec;\n"
            "pub struct Graph(Spec, super::Graph);\n",
        }
        _write(base, clean)
        _expect(check(base, ["clean/src"], []) == [], _found(base, "clean/src"))

        # A path through a re-export reaches the file the item is in.
        _write(base, {"clean/src/spec.rs": "pub struct Spec(crate::Graph);\n"})
        text = _found(base, "clean/src")
        cycle = "clean/src/scheduler/graph.rs -> clean/src/spec.rs"
        _expect(cycle in text, text)
        _expect("crate::Graph" in text, text)

        # A module using its child's item, the child an item of the module.
        _write(base, clean)
        _write(
            base,
            {
                "clean/src/scheduler/mod.rs": "mod graph;\npub struct Plan;\n"
                "fn f() { graph::build(); }\n",
                "clean/src/scheduler/graph.rs": "pub fn build() -> super::Plan {}\n",
            },
        )
        text = _found(base, "clean/src")
        cycle = "clean/src/scheduler/graph.rs -> clean/src/scheduler/mod.rs"
        _expect(cycle in text, text)
        _expect("graph::build" in text, text)

        # The same with the module's use of its child through a re-export.
        _write(
            base,
            {
                "clean/src/scheduler/mod.rs": "mod graph;\npub use graph::build;\n"
                "pub struct Plan;\nfn f() { build(); }\n",
            },
        )
        text = _found(base, "clean/src")
        _expect(cycle in text, text)
        _expect("graph::build" in text, text)
    print("check-layout self-test: circles and a long file found, a clean tree passed")


def main() -> int:
    """Run the check (or its self-test); the exit status says if it passed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--self-test",
        action="store_true",
        help="check that the check finds a known circle and passes a clean tree",
    )
    args = parser.parse_args()
    if args.self_test:
        self_test()
        return 0
    problems = check(REPO, list(RUST_ROOTS), list(PYTHON_GLOBS))
    if problems:
        print("\n".join(problems))
        return 1
    print(
        f"layout: no import circle in {', '.join(RUST_ROOTS)}; "
        f"no file over {MAX_LINES} lines"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
