"""Per-stage latency tracing: the tracer, its stages, exporters (JSON, Perfetto, OTel), the
report and waterfalls, and profiling. Imports no other part of agent/."""
