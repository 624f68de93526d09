"""`duplex bench tools` measures the README's agent's tools (examples/weather_agent.py), not copies."""
from agent.bench.tools import REQUESTS, bench_agent


def test_the_bench_offers_the_readme_tools_and_every_tool_its_requests_name():
    agent = bench_agent()
    names = {t.name for t in agent.tools}
    assert {r.tool for r in REQUESTS if r.tool} <= names
    weather = next(t for t in agent.tools if t.name == "get_weather")
    assert weather.fn.__module__ == "duplex_agent_weather_agent"  # loaded from the example's file
