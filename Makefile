# The two commands a newcomer needs: `make up` (the whole stack) and `make test`. Both set up what is missing.
VENV  := .venv
BIN   := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO  := var/demo/release

.PHONY: up sites demo serve bench mutate test compose-test sites-test swarm-test demo-test test-fast lint typecheck check clean docs

$(STAMP): pyproject.toml scripts/bootstrap.sh scripts/install_tools.sh
	bash scripts/bootstrap.sh

## up: the whole stack (Consul, registry, center, two edges, nginx); builds/publishes the demo
## release first if the registry has none; Ctrl-C stops everything
up: $(STAMP)
	$(BIN)/tiered up

## sites: many sites on this machine (root): a center site (3 Consul servers, registry, center)
## and two edge sites (a Consul agent, 2 edges, an nginx entry each), every host a network
## namespace with its own address; prints each site's entry; Ctrl-C stops everything
sites: $(STAMP)
	$(BIN)/tiered sites

## demo: build the demo release (cached after the first ~8 min) and publish it to ./var/registry (made if missing)
demo: $(STAMP)
	$(BIN)/python -m examples.sentiment.build --out $(DEMO)
	$(BIN)/registry publish $(DEMO) --name sentiment --skip-existing --create
	$(BIN)/registry list

## serve: run registry serve, the center and an edge; sync installs the demo release (Ctrl-C stops)
serve: demo
	bash scripts/serve.sh

## bench: every benchmark, side by side on this machine (~60 min): serving (edge/center vs raw
## runtimes), where the edge's Python time goes (py-spy), INT8 quantization settings on this CPU and an emulated AVX2 one, Tiered vs MLServer and KServe, the cascade report (docs/cascade.png), the cascade controller under a load ramp (docs/control.png), model sync, 100/1,000/10,000 nodes on one registry,
## chaos replay, fuzzing, 50 hot swaps, a 10-minute soak;
## each prints its tables and writes docs/bench/*.md, gathered into docs/benchmarks.md
bench: demo
	$(BIN)/python -m bench.tiers --markdown docs/bench/tiers.md
	$(BIN)/python -m bench.tiers --model digits --markdown docs/bench/tiers_digits.md
	$(BIN)/pip install -q py-spy && $(BIN)/python -m bench.profile --markdown docs/bench/profile.md
	$(BIN)/python -m bench.quantization --markdown docs/bench/quantization.md
	$(BIN)/python -m bench.peers --markdown docs/bench/peers.md
	$(BIN)/python -m bench.peers --model digits --markdown docs/bench/peers_digits.md
	$(BIN)/python -m bench.protocols --markdown docs/bench/protocols.md
	$(BIN)/python -m bench.cascade --markdown docs/bench/cascade.md --plot docs/cascade.png
	$(BIN)/python -m bench.cascade --model digits --markdown docs/bench/cascade_digits.md --plot docs/digits_cascade.png
	$(BIN)/python -m bench.control --markdown docs/bench/control.md --plot docs/control.png
	$(BIN)/python -m bench.rollout --markdown docs/bench/rollout.md
	$(BIN)/python -m bench.fleet --markdown docs/bench/fleet.md
	$(BIN)/python -m bench.fleet.series --markdown docs/bench/fleet_series.md
	$(BIN)/python -m bench.delta --markdown docs/bench/delta.md
	$(BIN)/python -m bench.tuf --markdown docs/bench/tuf.md
	$(BIN)/python -m bench.chaos --markdown docs/bench/chaos.md
	$(BIN)/python -m bench.fuzz --markdown docs/bench/fuzz.md
	$(BIN)/python -m bench.swaps --markdown docs/bench/swaps.md
	$(BIN)/python -m bench.sites --markdown docs/bench/sites.md
	$(BIN)/python -m bench.swarm --markdown docs/bench/swarm.md
	$(BIN)/python -m bench.soak --minutes 10 --markdown docs/bench/soak.md
	$(BIN)/python -m bench.registry_backup --markdown docs/bench/registry_backup.md
	$(BIN)/python -m bench.failover --markdown docs/bench/registry_failover.md
	$(BIN)/python -m bench.console --markdown docs/bench/console.md
	$(BIN)/python -m bench.report

## mutate: mutation testing of the hot modules (serving/inputs/, edge/pipeline.py, cache.py,
## audit.py, registry/releases/; pyproject [tool.mutmut]): mutmut puts one-line bugs in a copy
## (mutants/), runs the unit tests that reach each one, prints the kill rate per module
## (docs/reliability.md; ~50 min for its 4,849 mutants on 2 cores, then only what changed);
## not in CI
MUTATE_CHILDREN ?= 2
mutate: $(STAMP)
	$(BIN)/pip install -q 'mutmut>=3.8,<4'
	PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 $(BIN)/mutmut run --max-children $(MUTATE_CHILDREN)
	$(BIN)/python -m bench.mutation

## test: the whole suite (unit + integration, slow tests included)
test: $(STAMP)
	$(BIN)/python -m pytest

## compose-test: build every image and run the compose stack end to end on a private dockerd:
## publish, an edge killed under load, the primary registry killed and a publish through the
## standby (root; scripts/docker_here.sh; builds its own tiny release; ~2 min warm, ~7 cold);
## not part of `make test`
compose-test: $(STAMP)
	$(BIN)/python -m pytest tests/containers --containers -s -p no:cacheprovider

## sites-test: the three sites through partitions 1-5 and the registry faults 6a-6c under load
## (root, ~6 min; builds its own tiny releases); not part of `make test`
sites-test: $(STAMP)
	$(BIN)/python -m pytest tests/sites --sites -s -p no:cacheprovider

## swarm-test: deploy/swarm/stack.yml on five dockerd nodes (network namespaces, one swarm):
## deployed, a publish, a rolling edge update, an edge host lost and a node drained under load
## (root; ~10 min warm, the images' build first when cold); not part of `make test`
swarm-test: $(STAMP)
	$(BIN)/python -m pytest tests/swarm --swarm -s -p no:cacheprovider

## demo-test: make up on a fresh registry, end to end with the real demo release: the quick
## release answers first, the full one is trained behind (~12 min), published and rolled out
## under load with no failed request; prints the timings (~20 min); not part of `make test`
demo-test: $(STAMP)
	$(BIN)/python -m pytest tests/demo --demo -s -p no:cacheprovider

## test-fast: skip the slow tests
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow"

## lint: ruff, and the layering contract (pyproject [tool.importlinter]: a lower package never
## imports a higher one)
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

## docs: regenerate the settings tables of docs/operations.md and docs/registry.md from the
## settings classes (a test fails when they differ)
docs: $(STAMP)
	$(BIN)/python -m tiered.settings_doc

check: lint typecheck test

clean:
	rm -rf var .mypy_cache .ruff_cache .pytest_cache mutants
