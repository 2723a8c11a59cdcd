"""No module of gangshare imports itself back through others, counting imports made only for
type checking or inside functions: a circle is two modules that cannot be read, tested or
split apart alone (sim/ had two: engine and openmetrics, report and its pages)."""

from __future__ import annotations

import grimp


def circles(imports: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(imports):
        if root in index:
            continue
        work = [(root, iter(sorted(imports[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(imports.get(target, ())))))
                elif target in on_stack:
                    low[module] = min(low[module], index[target])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[module])
            if low[module] == index[module]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == module:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_the_circle_finder_finds_a_circle_and_only_that():
    imports = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(imports) == [["a", "b", "c"]]


def test_gangshare_has_no_import_circles():
    graph = grimp.build_graph("gangshare")
    modules = {m for m in graph.modules if m.startswith("gangshare.")}
    imports = {
        m: {t for t in graph.find_modules_directly_imported_by(m) if t in modules} for m in modules
    }
    assert circles(imports) == []
