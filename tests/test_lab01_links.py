"""Lab 01's links (lab/01_links.py, minigpt/parallel/links.py): the α–β fit and the ring's time on
numbers worked by hand; four ranks as two nodes of two, where the flat ring and the hierarchical one
give the exact sum and send across nodes the bytes counted here by hand; and the page's tables, drawn
from the committed run (``torchrun --nproc_per_node=4 lab/01_links.py --repeats 101 --out lab/results``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from minigpt.pages import lab01_links as pages
from minigpt.parallel import links
from tests import launcher
from tests.limits import limit

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "lab" / "results"
GRADIENT = 2_030_208  # MiniGPT's float32 gradient: 507,552 parameters x 4 B


def test_the_fit_finds_the_line_and_refuses_what_has_no_bandwidth():
    sizes = [1e3, 1e4, 1e5, 1e6, 1e7]
    alpha, beta = links.fit_alpha_beta(sizes, [50e-6 + s / 2e9 for s in sizes])
    assert alpha == pytest.approx(50e-6, rel=1e-9) and beta == pytest.approx(2e9, rel=1e-9)
    with pytest.raises(ValueError, match="two sizes"):
        links.fit_alpha_beta([1e3, 1e3], [1e-4, 1e-4])
    with pytest.raises(ValueError, match="do not grow"):
        links.fit_alpha_beta([1e3, 1e6], [2e-3, 1e-3])


def test_the_ring_time_and_the_bytes_across_nodes_worked_by_hand():
    # 2 ranks: 2 steps of one message of S/2 = 1,015,104 B: 2 x (100 us + 1.015104 ms) at 1 GB/s
    assert links.ring_all_reduce_seconds(GRADIENT, 2, 1e-4, 1e9) == pytest.approx(2.230208e-3, rel=1e-12)
    # 4 ranks, 2 nodes of 2. Flat ring: ranks 1 and 3 send to the other node, each 2 x 3/4 x S = 3,045,312 B.
    # Hierarchical: each rank sends its half of the node's sum across, 2 x 1/2 x S/2 = 1,015,104 B.
    assert links.crossing_bytes(GRADIENT, 4, 2) == {
        "flat_total": 6_090_624,
        "flat_link": 3_045_312,
        "hierarchical_total": 4_060_416,
        "hierarchical_link": 1_015_104,
    }


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("links")
    done = launcher.run_script(["lab/01_links.py", "--repeats", "3", "--out", str(out)], 4, limit(120))
    return done, out


def test_two_nodes_of_two_sum_exactly_and_send_the_counted_bytes_across(four_ranks):
    done, out = four_ranks
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    nodes = json.loads((out / "01-links-cpu.json").read_text())["nodes"]
    assert [(r["flat_exact"], r["hierarchical_exact"]) for r in nodes["ranks"]] == [(True, True)] * 4
    assert (nodes["flat_crossing"], nodes["hierarchical_crossing"]) == (6_090_624, 4_060_416)
    for rank, r in enumerate(nodes["ranks"]):
        # flat: 2(N-1)/N S each; hierarchical: 2(L-1)/L S inside the node, 2(M-1)/M S/L across
        assert (r["flat_sent"], r["inside_sent"], r["across_sent"]) == (3_045_312, 2_030_208, 1_015_104), rank
        assert r["flat_crossing"] == (3_045_312 if rank in (1, 3) else 0), rank
    assert "PASS     hierarchical bytes across nodes = model" in done.stdout
    for lang in ("en", "es"):
        for part in ("link", "nodes", "paper"):
            assert (out / f"01-links-{part}-{lang}.txt").read_text().startswith("| ")


def test_the_page_shows_the_committed_run():
    result = json.loads((RESULTS / "01-links-cpu.json").read_text())
    assert result["nodes"]["hierarchical_crossing"] == 4_060_416
    for lang in ("en", "es"):
        for part, text in (
            ("link", pages.link_table(result, lang)),
            ("nodes", pages.nodes_table(result, lang)),
            ("paper", pages.paper_table(lang)),
        ):
            assert (RESULTS / f"01-links-{part}-{lang}.txt").read_text() == text, (part, lang)
    # the paper's 10 GbE row for a 10^9-parameter bf16 gradient on 8 ranks: 14 steps of 30 us + 250 MB / 1.25 GB/s
    assert "2,800.42 ms" in pages.paper_table("en") and "2800,42 ms" in pages.paper_table("es")


def test_the_pages_sentences_hold_for_the_committed_run():
    """The page says: β drops to about half when each rank sends while it receives; the all-gather half
    costs about one both-ways message, the reduce-scatter half more."""
    result = json.loads((RESULTS / "01-links-cpu.json").read_text())
    one, both = result["link"], result["link_both_ways"]
    assert 0.35 < both["beta"] / one["beta"] < 0.65, (one["beta"], both["beta"])
    for b in result["buckets"]:
        message = links.message_seconds(b["bytes"] / 2, both["alpha"], both["beta"])  # 2 ranks: one step of S/2
        assert 0.5 < b["halves"]["all_gather"] / message < 2.0, b
        assert b["halves"]["reduce_scatter"] > b["halves"]["all_gather"], b
