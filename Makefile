# The two commands of the README. Both run the same idempotent set-up first.
HOST ?= 127.0.0.1
PORT ?= 8080
PYTEST_ARGS ?=

.PHONY: setup peers serve test
setup:
	bash scripts/setup.sh

peers:  # third-party clients the tests run against our servers (their own virtualenv)
	bash scripts/setup_peers.sh

serve: setup
	.venv/bin/duplex serve --host $(HOST) --port $(PORT)

test: setup peers
	.venv/bin/python -m pytest -v -rs $(PYTEST_ARGS)
