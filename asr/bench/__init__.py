"""`duplex asr-bench`: load clients and engine benchmarks. Nothing else imports it."""
