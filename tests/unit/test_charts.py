"""The dashboard's chart geometry (shardq/charts.py): round ticks, stacked
bars, lines broken where a minute has no value."""

import math

from shardq.charts import HEIGHT, LEFT, Series, bar_chart, line_chart, nice_ticks


def test_ticks_are_round_and_reach_the_top():
    assert nice_ticks(10) == [0, 2.5, 5, 7.5, 10]
    assert nice_ticks(10, whole=True) == [0, 5, 10]
    assert nice_ticks(3, whole=True) == [0, 1, 2, 3]
    assert nice_ticks(0.0123) == [0, 0.005, 0.01, 0.015]
    assert nice_ticks(0) == [0, 1] and nice_ticks(math.inf) == [0, 1]


def test_bars_stack_their_series_and_skip_empty_values():
    chart = bar_chart(
        "t",
        "jobs",
        "time",
        ["a", "b"],
        [Series("ok", "successful", [3, 0]), Series("failed", "failed", [1, None])],
        ticks_at=[0],
        fmt=str,
        whole=True,
    )
    ok, failed = chart["bars"]
    assert (ok["label"], ok["value"], failed["value"]) == ("a", 3, 1)
    assert failed["y"] + failed["h"] == ok["y"]  # on top of the SUCCESSFUL bar
    assert chart["y_ticks"][0]["label"] == "0" and chart["x_ticks"] == [{"x": LEFT, "label": "a"}]
    assert all(0 <= t["y"] <= HEIGHT for t in chart["y_ticks"])


def test_a_line_breaks_where_a_value_is_missing_and_infinity_is_drawn_at_the_top():
    chart = line_chart(
        "t", "s", "time", list("abcd"), [Series("p99", "p99", [1.0, None, 2.0, math.inf])], ticks_at=[], fmt=str
    )
    [line] = chart["lines"]
    assert [p["label"] for p in line["points"]] == ["a", "c", "d"]
    assert line["path"].count("M") == 2  # the gap at "b" lifts the pen
    assert line["points"][2]["y"] == chart["top"]


def test_a_workflow_graph_puts_each_child_right_of_its_parents():
    from shardq.charts import graph_layout

    nodes = [{"id": i} for i in range(1, 6)]
    # 1 -> 2 -> 4, 1 -> 3 -> 4, and 5 waits for 1 and 4 (its longest path is 3 long).
    edges = [(1, 2), (1, 3), (2, 4), (3, 4), (1, 5), (4, 5)]
    graph = graph_layout(nodes, edges)
    x = {n["id"]: n["x"] for n in graph["nodes"]}
    assert x[1] < x[2] == x[3] < x[4] < x[5]
    assert all(e["x2"] > e["x1"] for e in graph["edges"]) and len(graph["edges"]) == 6
    assert graph["width"] >= max(n["x"] + n["w"] for n in graph["nodes"])
    assert graph["height"] >= max(n["y"] + n["h"] for n in graph["nodes"])


def test_a_long_chain_is_laid_out_without_recursion():
    from shardq.charts import graph_layout

    n = 5000
    graph = graph_layout([{"id": i} for i in range(n)], [(i, i + 1) for i in range(n - 1)])
    assert len({node["x"] for node in graph["nodes"]}) == n
