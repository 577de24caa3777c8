# make demo / make test: set up a virtual environment, build the tiny bundle, run.
PYTHON ?= python3
VENV ?= .venv
BUNDLE ?= .cache/tiny-bundle
BIN := $(VENV)/bin

.PHONY: install bundle demo test lint clean

$(BIN)/molmoact2: setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

install: $(BIN)/molmoact2

$(BUNDLE)/.stamp: $(BIN)/molmoact2 $(wildcard molmoact2_ros/synth/*.py)
	rm -rf $(BUNDLE)
	$(BIN)/molmoact2 tiny-bundle $(BUNDLE)
	touch $@

bundle: $(BUNDLE)/.stamp

demo: bundle
	$(BIN)/molmoact2 demo $(BUNDLE)
	$(BIN)/molmoact2 parity $(BUNDLE)

lint: install
	$(BIN)/ruff check .

test: lint bundle
	MOLMOACT2_TINY_BUNDLE=$(abspath $(BUNDLE)) $(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache
