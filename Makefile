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

.PHONY: install bundle demo test lint clean

$(BIN)/molmoact2: setup.py
	@echo "== make: installing molmoact2_ros into $(VENV) with its test extra (numpy, tokenizers,"
	@echo "   tqdm, pillow, opencv, numba, onnxruntime, onnx, rosbags, safetensors, matplotlib, ray,"
	@echo "   pytest, ruff, and LIBERO with imageio for the closed-loop tests: about 2.5 GB);"
	@echo "   the first time takes 2-4 min"
	@start=$$(date +%s); \
	$(PYTHON) -m venv $(VENV) && \
	$(BIN)/python -m pip install --quiet --upgrade pip && \
	$(BIN)/python -m pip install -e '.[test]' && \
	echo "== make: installed in $$(( $$(date +%s) - start )) s"
	touch $@

install: $(BIN)/molmoact2

$(BUNDLE)/.stamp: $(BIN)/molmoact2 $(wildcard molmoact2_ros/synth/*.py)
	@echo "== make: writing the tiny synthetic bundles to $(BUNDLE)"
	rm -rf $(BUNDLE)
	$(BIN)/molmoact2 tiny-bundle $(BUNDLE)
	touch $@

bundle: $(BUNDLE)/.stamp

demo: bundle
	@echo "== make: demo: every variant's pipeline on its sample observation"
	$(BIN)/molmoact2 demo $(BUNDLE)
	@echo "== make: parity: every session and trace against the goldens"
	$(BIN)/molmoact2 parity $(BUNDLE)
	@echo "== make: replay: record a golden chunk bag from a JPEG bag, then check a replay against it"
	mkdir -p $(DEMO)
	$(BIN)/molmoact2 trace-to-bag $(BUNDLE)/grid_sampler/golden/e2e_trace.npz $(DEMO)/obs_bag \
		--frames 6 --compressed jpeg --force
	$(BIN)/molmoact2 replay $(DEMO)/obs_bag --bundle-root $(BUNDLE) --variant grid_sampler \
		--set compressed_images=true --instruction "$(TASK)" --seed 7 \
		--record $(DEMO)/golden_bag --force
	$(BIN)/molmoact2 replay $(DEMO)/obs_bag --bundle-root $(BUNDLE) --set compressed_images=true \
		--golden $(DEMO)/golden_bag --report $(DEMO)/report --force
	@echo "== make: demo done: every variant ran on its sample observation, passed parity and replayed against a golden bag"

lint: install
	$(BIN)/ruff check .

test: lint bundle
	MUJOCO_GL=$(MUJOCO_GL) MOLMOACT2_TINY_BUNDLE=$(abspath $(BUNDLE)) $(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache
