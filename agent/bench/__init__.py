"""The benchmarks: `duplex bench latency|load|soak|quality|tools|turns|pipecat`. They import the
product; nothing of the product imports them."""
