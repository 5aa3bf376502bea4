# The two commands of the README, plus a few shortcuts for developers.
.PHONY: up test test-fast lint venv

up:            ## run a local fleet (engine twins + router) on loopback
	scripts/up.sh $(ARGS)

test:          ## lint, type-check and run every test suite (builds the control plane once)
	scripts/test.sh

test-fast:     ## unit tests only (no compile unless router/native changed)
	scripts/venv.sh dev && .venv/bin/pytest -m unit -q

lint:          ## ruff and mypy
	scripts/venv.sh dev && .venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy

venv:
	scripts/venv.sh dev
