"""The package's import graph: no cycles anywhere (the layer contract itself runs in `make lint`: lint-imports)."""

from __future__ import annotations

import grimp


def test_no_module_imports_itself_through_others() -> None:
    graph = grimp.build_graph("heterorl", exclude_type_checking_imports=True)
    cycles = sorted(
        (importer, imported)
        for importer in graph.modules
        for imported in graph.find_modules_directly_imported_by(importer)
        if graph.chain_exists(importer=imported, imported=importer)
    )
    assert cycles == []


def test_the_clock_free_loop_reaches_no_driver() -> None:
    graph = grimp.build_graph("heterorl", exclude_type_checking_imports=True)
    for low in ("heterorl.loop", "heterorl.sampler", "heterorl.learner", "heterorl.objectives", "heterorl.weights"):
        for high in (
            "heterorl.simulated",
            "heterorl.live",
            "heterorl.transport",
            "heterorl.launch",
            "heterorl.api",
            "heterorl.cli",
        ):
            assert not graph.chain_exists(importer=low, imported=high, as_packages=True), (low, high)
