# The two fresh-machine commands (README): `make run` and `make test`.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
XLA_CPU8 := --xla_force_host_platform_device_count=8

.PHONY: install image run lint test test-all clean

$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed

# Sandbox images: a debootstrapped Debian base (docker import) + one image per task.
image: install
	bash envs/build_base_image.sh
	$(PY) envs/build_task_images.py

# The main job: a small end-to-end RL run on CPU with Docker sandboxes (SFT warm start, then RL).
run: install image
	$(PY) experiments/rl.py --config=configs/rl_tiny.py

# The structure checks CI runs before the suite: the layer contract (setup.cfg) and ruff (pyproject.toml).
lint: install
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check .

# The default suite (slow and GPU tests are deselected in setup.cfg; `make test-all` runs slow too).
test: install image
	XLA_FLAGS="$(XLA_CPU8)" $(PY) -m pytest

test-all: install image
	XLA_FLAGS="$(XLA_CPU8)" $(PY) -m pytest -m "not gpu"

clean:
	rm -rf $(VENV) runs
