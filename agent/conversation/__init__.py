"""One conversation: the session and its parts (listener, turn-taking, end-of-turn policies,
replies and their pipeline, history, model loading). Imports tracing and the toolkit, never
serving or the benchmarks."""
