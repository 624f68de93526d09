# The two commands of the README. Both run the same idempotent set-up first.
HOST ?= 127.0.0.1
PORT ?= 8080
PYTEST_ARGS ?=

.PHONY: setup serve test
setup:
	bash scripts/setup.sh

serve: setup
	.venv/bin/duplex serve --host $(HOST) --port $(PORT)

test: setup
	.venv/bin/python -m pytest -v -rs $(PYTEST_ARGS)
