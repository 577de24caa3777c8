# make demo / make test: set up a virtual environment, build the tiny bundle, run.
PYTHON ?= python3
VENV ?= .venv
BUNDLE ?= .cache/tiny-bundle
DEMO ?= .cache/demo
TASK ?= put both the alphabet soup and the tomato sauce in the basket
BIN := $(VENV)/bin
# headless rendering of the LIBERO tests: egl (libegl1 libegl-mesa0 libgl1-mesa-dri) or osmesa
# (libosmesa6); .ci/run installs both on a fresh Debian/Ubuntu machine run as root
MUJOCO_GL ?= egl
# with a ROS 2 sourced, `make test` colcon-builds the package here and runs from its install
ROS_WS ?= .cache/ros_ws
ROS_TESTS = $(wildcard tests/test_*_rclpy.py tests/test_launch_*.py)

.PHONY: help install bundle demo test test-quick test-ros lint docs clean
.DEFAULT_GOAL := help

# Each stage prints one "== make:" line, then only what its command prints (pip stays quiet).

help: ## list the targets
	@echo "make TARGET (everything goes into $(VENV)/ and .cache/; no ROS, NPU or weights needed):"
	@awk -F':.*## ' '/^[a-z-]+:.*## / {printf "  %-11s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(VENV)/.test-extra: setup.py
	@echo "== make: install: molmoact2_ros and its test extra into $(VENV), LIBERO included"
	@echo "   (about 2.8 GB; 4-6 min the first time on a busy 2-core machine)"
	@start=$$(date +%s); \
	{ test -x $(BIN)/python || $(PYTHON) -m venv $(VENV); } && \
	$(BIN)/python -m pip install --quiet --upgrade pip && \
	$(BIN)/python -m pip install --quiet -e '.[test]' && \
	echo "== make: installed in $$(( $$(date +%s) - start )) s"
	@touch $@

# the tiny bundles need only the package and onnx (the synth extra, about 200 MB), so
# `make bundle` alone, e.g. before a colcon build, does not install the test environment
$(VENV)/.synth-extra: setup.py
	@echo "== make: install: molmoact2_ros and its synth extra (onnx) into $(VENV)"
	@{ test -x $(BIN)/python || $(PYTHON) -m venv $(VENV); } && \
	$(BIN)/python -m pip install --quiet -e '.[synth]'
	@touch $@

install: $(VENV)/.test-extra ## create the virtual environment with the package and its test extra

$(BUNDLE)/.stamp: $(VENV)/.synth-extra $(wildcard molmoact2_ros/synth/*.py)
	@echo "== make: bundle: the tiny synthetic bundles into $(BUNDLE)"
	@rm -rf $(BUNDLE)
	@$(BIN)/molmoact2 tiny-bundle $(BUNDLE)
	@touch $@

bundle: $(BUNDLE)/.stamp ## write the tiny synthetic bundles (installs only the package and onnx)

demo: install bundle ## run every variant, check parity, replay a bag against a golden chunk bag
	@echo "== make: demo: every variant's pipeline on its sample observation"
	@$(BIN)/molmoact2 demo $(BUNDLE)
	@echo "== make: parity: every session and trace against the goldens"
	@$(BIN)/molmoact2 parity $(BUNDLE)
	@echo "== make: replay: record a golden chunk bag from a JPEG bag, then check a replay against it"
	@mkdir -p $(DEMO)
	@$(BIN)/molmoact2 trace-to-bag $(BUNDLE)/grid_sampler/golden/e2e_trace.npz $(DEMO)/obs_bag \
		--frames 6 --compressed jpeg --force
	@$(BIN)/molmoact2 replay $(DEMO)/obs_bag --bundle-root $(BUNDLE) --variant grid_sampler \
		--set compressed_images=true --instruction "$(TASK)" --seed 7 \
		--record $(DEMO)/golden_bag --force
	@$(BIN)/molmoact2 replay $(DEMO)/obs_bag --bundle-root $(BUNDLE) --set compressed_images=true \
		--golden $(DEMO)/golden_bag --report $(DEMO)/report --force
	@echo "== make: demo done: every variant ran on its sample observation, passed parity and replayed against a golden bag"

lint: install ## ruff over the repository
	@echo "== make: lint: ruff check ."
	@$(BIN)/ruff check .

test: lint bundle ## lint, then the whole test suite on the tiny bundles (what CI runs; with a ROS 2 sourced, its node and launch tests too)
	@if [ -n "$$ROS_DISTRO" ]; then \
	  echo "== make: test: ROS 2 $$ROS_DISTRO is sourced: the whole suite from a colcon build, rclpy and launch tests included (LIBERO renders with MUJOCO_GL=$(MUJOCO_GL))"; \
	  MUJOCO_GL=$(MUJOCO_GL) MOLMOACT2_TINY_BUNDLE=$(abspath $(BUNDLE)) VENV=$(VENV) ROS_WS=$(ROS_WS) \
	    bash tests/ros_suite.sh -q -o faulthandler_timeout=900 --durations=15; \
	else \
	  echo "== make: test: pytest (no ROS 2 sourced: the rclpy and launch tests skip; LIBERO renders with MUJOCO_GL=$(MUJOCO_GL))"; \
	  MUJOCO_GL=$(MUJOCO_GL) MOLMOACT2_TINY_BUNDLE=$(abspath $(BUNDLE)) $(BIN)/python -m pytest -q -o faulthandler_timeout=900 --durations=15; \
	fi

test-ros: install bundle ## only the rclpy and launch tests, under the sourced ROS 2 (from a colcon build)
	@MUJOCO_GL=$(MUJOCO_GL) MOLMOACT2_TINY_BUNDLE=$(abspath $(BUNDLE)) VENV=$(VENV) ROS_WS=$(ROS_WS) \
	  bash tests/ros_suite.sh -q -o faulthandler_timeout=900 --durations=15 $(ROS_TESTS)

test-quick: bundle ## the quick subset for inner loops: the files tests/conftest.py marks slow left out
	@echo "== make: test-quick: pytest -m 'not slow' (make test runs everything)"
	@MUJOCO_GL=$(MUJOCO_GL) MOLMOACT2_TINY_BUNDLE=$(abspath $(BUNDLE)) $(BIN)/python -m pytest -q -m "not slow" --durations=15

docs: install ## regenerate docs/parameters.md from the parameter table
	@echo "== make: docs: docs/parameters.md from control/params.py"
	@$(BIN)/python -m molmoact2_ros.control.params_doc docs/parameters.md

clean: ## remove the virtual environment and .cache
	@echo "== make: clean: $(VENV) .cache .pytest_cache .ruff_cache"
	@rm -rf $(VENV) .cache .pytest_cache .ruff_cache
