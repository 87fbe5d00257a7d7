# Everything a fresh machine needs: `make test` and `make demo` create .venv and install into it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.portkern-installed
DEMO_DIR ?= demo-out
# tests run in this many processes (pytest-xdist): most are one core of interpreter work each
TEST_WORKERS ?= 2

.PHONY: test test-fast demo clean-demo venv

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# the CPU build of torch first, so no extra pulls a multi-GB CUDA build
	$(BIN)/python -m pip install -q "torch==2.13.0"
	$(BIN)/python -m pip install -q -e ".[triton,tvm,npu,export,postgres,test]"
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m "not slow" --durations=15

test-all: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --durations=25

# Tune a real model for the host CPU, write a pack, run the model with it, print the speedup table.
# The model: a BERT-style encoder (2 layers, hidden 256, 4 heads, seq 128) exported from transformers.
DEMO_SHAPE := --shape input_ids=1x128
demo: $(STAMP)
	rm -rf $(DEMO_DIR) && mkdir -p $(DEMO_DIR)
	$(BIN)/python -m portkern.models bert --out $(DEMO_DIR)/bert.onnx --layers 2 --hidden 256 --heads 4 \
		--intermediate 1024 --seq 128
	$(BIN)/portkern inspect $(DEMO_DIR)/bert.onnx --target cpu $(DEMO_SHAPE)
	$(BIN)/portkern tune $(DEMO_DIR)/bert.onnx --target cpu $(DEMO_SHAPE) --trials 80 --per-task-trials 16 \
		--time-budget 240 -o $(DEMO_DIR)/bert.pkpack
	$(BIN)/portkern inspect $(DEMO_DIR)/bert.pkpack
	$(BIN)/portkern run $(DEMO_DIR)/bert.onnx --pack $(DEMO_DIR)/bert.pkpack
	$(BIN)/portkern bench $(DEMO_DIR)/bert.onnx --pack $(DEMO_DIR)/bert.pkpack --repeats 100

clean-demo:
	rm -rf $(DEMO_DIR)
