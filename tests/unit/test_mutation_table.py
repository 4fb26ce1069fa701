"""The mutation table stays runnable: each mutation finds its source once and names tests.

A rewrite of a guarded line leaves its mutation pointing at text that is gone; the harness
then reports it NOT FOUND instead of killed or survived, and nothing failed until a full
run (four such entries waited for one after the run rows' liveness became a callable).
"""

from __future__ import annotations

from harness import mutations


def test_every_mutation_finds_its_source_once_and_names_existing_tests() -> None:
    ids = [m.id for m in mutations.MUTATIONS]
    assert len(ids) == len(set(ids)), "a mutation id is used twice"
    for m in mutations.MUTATIONS:
        source = (mutations.ROOT / m.file).read_text()
        assert source.count(m.old) == 1, (
            f"{m.id}: its source is in {m.file} {source.count(m.old)} times"
        )
        assert m.old != m.new, m.id
        assert m.tests, f"{m.id} names no test"
        for test in m.tests:
            assert (mutations.ROOT / test.split("::")[0]).is_file(), f"{m.id}: no {test}"
    assert set(mutations.EQUIVALENT) <= set(ids), "an equivalence names no mutation"
