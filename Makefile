# Developer shortcuts. The README's two commands work without make.
PY ?= .venv/bin/python

.PHONY: install lint test unit e2e bench soak run demo
install:
	python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev]'
lint:
	$(PY) -m ruff check . && $(PY) -m ruff format --check . && $(PY) -m mypy shared training_server prediction_server coalescer stack scheduler_client
test:
	$(PY) -m pytest
unit:
	$(PY) -m pytest tests/unit tests/service
e2e:
	$(PY) -m pytest -m e2e
bench:  # each writes its report under docs/; see docs/benchmarks.md (takes ~85 min in all)
	OMP_NUM_THREADS=1 $(PY) bench/training_ingest.py --out docs/benchmarks-training.md
	OMP_NUM_THREADS=1 $(PY) bench/prediction_load.py --runs 3 --step-s 3 --probe-s 1.5 --fractions 0.8,1.0,1.2 --max-steps 7 --calibration-every-s 0.25
	OMP_NUM_THREADS=1 taskset -c 1 $(PY) bench/model_load.py
	OMP_NUM_THREADS=1 taskset -c 1 $(PY) bench/tree_eval.py
	OMP_NUM_THREADS=1 $(PY) bench/coalescer_load.py --no-pin --out docs/benchmarks-coalescer.md
	OMP_NUM_THREADS=1 $(PY) bench/accuracy_report.py --seeds 0 1 2 --duration-s 900 --out docs/accuracy-history.md --plot docs/accuracy-calibration.png
	OMP_NUM_THREADS=1 $(PY) bench/accuracy_evidence.py --out docs/benchmarks-accuracy.md
	OMP_NUM_THREADS=1 $(PY) -m bench.routing_compare
	for rps in 14 17 20 24; do OMP_NUM_THREADS=1 $(PY) -m bench.routing_online --rps $$rps; done
	OMP_NUM_THREADS=1 $(PY) -m bench.routing_rollout
soak:  # the whole stack under the demo workload for one simulated hour (30 min), its resources sampled
	OMP_NUM_THREADS=1 $(PY) -m bench.soak
run:
	$(PY) -m stack
demo:
	$(PY) -m stack --demo
