"""A voice agent with two tools: duplex run|serve|talk --agent examples/weather_agent.py:agent"""
from agent import Agent, end_call, function_tool

FORECASTS = {"paris": "sunny and 24 degrees", "london": "light rain and 15 degrees"}


@function_tool
async def get_weather(city: str) -> str:
    """Get today's weather forecast for a city.

    Args:
        city: The name of the city, for example Paris.
    """
    return FORECASTS.get(city.strip().lower(), "cloudy and 18 degrees")


@function_tool
def get_time(city: str) -> str:
    """Get the local time in a city.

    Args:
        city: The name of the city.
    """
    return "half past three in the afternoon"


agent = Agent(
    instructions="You are a helpful voice assistant. Use the tools to answer questions about "
                 "the weather or the time. Reply in one short sentence.",
    tools=[get_weather, get_time, end_call],
)
