"""The grammar cache: one compile per key under concurrency, LRU, failure policy, stats."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid

import pytest
from grammar_testkit import matches, smol_tokenizer

from runtime.backends import BackendChain
from runtime.constraint import Constraint
from runtime.errors import InvalidSchema
from runtime.grammar_cache import GrammarCache


@pytest.fixture(scope="module")
def chain():
    return BackendChain(smol_tokenizer(), ["llguidance", "xgrammar"])


@pytest.fixture
def cache(chain):
    cache = GrammarCache(chain, max_entries=8, workers=2)
    yield cache
    cache.close()


def new_schema(kind: str = "json") -> Constraint:
    """A schema no cache has seen: its property name is random."""
    name = "p" + uuid.uuid4().hex[:8]
    schema = {
        "type": "object",
        "properties": {name: {"type": "integer"}},
        "required": [name],
        "additionalProperties": False,
    }
    return Constraint.json_schema(schema, kind=kind)


def test_fifty_threads_compile_a_new_schema_once(cache):
    constraint = new_schema()
    barrier = threading.Barrier(50)
    results = []

    def request():
        barrier.wait()
        results.append(cache.get(constraint))

    threads = [threading.Thread(target=request) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 50 and all(r is results[0] for r in results)
    stats = cache.stats()["json"]
    assert stats["compiles"] == 1 and stats["misses"] == 1 and stats["hits"] == 49
    assert stats["compile_ms_sum"] > 0


def test_fifty_coroutines_compile_a_new_schema_once(cache):
    constraint = new_schema(kind="tools")

    async def burst():
        return await asyncio.gather(*(cache.aget(constraint) for _ in range(50)))

    results = asyncio.run(burst())
    assert len({id(r) for r in results}) == 1
    stats = cache.stats()["tools"]
    assert (stats["compiles"], stats["misses"], stats["hits"]) == (1, 1, 49)


def test_a_waiter_that_leaves_does_not_cancel_the_compile_others_wait_for(chain):
    """Two requests share a compile still queued behind others; the first one's client leaves
    (its task is cancelled). The second must still get the grammar."""
    cache = GrammarCache(chain, workers=1)
    release = threading.Event()
    cache._pool.submit(release.wait)  # the one worker is busy: the compile below queues
    constraint = new_schema()

    async def scenario():
        leaving = asyncio.ensure_future(cache.aget(constraint))
        staying = asyncio.ensure_future(cache.aget(constraint))
        await asyncio.sleep(0.01)
        leaving.cancel()
        await asyncio.sleep(0.01)
        release.set()
        return await staying

    try:
        assert asyncio.run(scenario()) is cache.get(constraint)
    finally:
        release.set()
        cache.close()


def test_equivalent_spelling_shares_an_entry(cache):
    a = Constraint.json_schema({"type": "string", "maxLength": 3})
    b = Constraint.json_schema(json.loads('{ "type" : "string",\n  "maxLength" : 3 }'))
    assert cache.get(a) is cache.get(b)
    assert cache.stats()["json"]["compiles"] == 1


def test_lru_bound_and_eviction(cache):
    first = new_schema()
    cache.get(first)
    for _ in range(8):
        cache.get(new_schema())
    assert len(cache) == 8
    cache.get(first)  # evicted: compiled again
    assert cache.stats()["json"]["compiles"] == 10


def test_compiled_grammar_from_cache_enforces(cache):
    compiled = cache.get(Constraint.regex("[0-9]{2}"))
    assert compiled.backend == "llguidance"
    assert matches(compiled.matcher(), "42") and not matches(compiled.matcher(), "4a")
    assert cache.stats()["regex"]["compiles"] == 1


def test_input_failures_are_cached_other_failures_are_not(cache):
    bad = Constraint.json_schema({"type": "objekt"})
    for _ in range(2):
        with pytest.raises(InvalidSchema):
            cache.get(bad)
    assert cache.stats()["json"]["compiles"] == 1  # deterministic: cached
    assert cache.stats()["json"]["failures"] == 1

    broken = Constraint("json", "{not json")  # a caller bug, not a request error
    for _ in range(2):
        with pytest.raises(ValueError):
            cache.get(broken)
    assert cache.stats()["json"]["compiles"] == 3  # compiled afresh each time


def test_the_key_binds_backend_order_and_tokenizer(cache, chain):
    other = GrammarCache(BackendChain(smol_tokenizer(), ["xgrammar"]))
    try:
        constraint = Constraint.regex("a")
        assert cache.key(constraint) != other.key(constraint)
        assert cache.key(constraint)[3] == chain.tokenizer_digest
        assert other.get(constraint).backend == "xgrammar"
    finally:
        other.close()


def test_a_grammar_nested_past_a_default_thread_stack_compiles_on_the_pool() -> None:
    """3,000 rules each naming the next overflowed an 8 MB thread stack inside llguidance
    (SIGSEGV: the process died). With the depth limit lifted, the pool's deep stacks hold it.
    Run in a child process, so a regression fails this test instead of killing the suite."""
    import subprocess
    import sys
    from pathlib import Path

    code = """
import sys
sys.path.insert(0, "tests/runtime")
from grammar_testkit import smol_tokenizer
from runtime.backends import BackendChain
from runtime.grammar_cache import GrammarCache
from runtime.constraint import Constraint
from runtime.limits import Limits
chain = BackendChain(smol_tokenizer(), "llguidance", Limits(max_grammar_depth=10**6))
grammar = "start: r0\\n" + "\\n".join(f"r{i}: r{i + 1}" for i in range(3000)) + '\\nr3000: "a"'
GrammarCache(chain).submit(Constraint.ebnf(grammar)).result()
print("compiled")
"""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and "compiled" in done.stdout, (done.returncode, done.stderr[-500:])
