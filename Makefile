# The two commands of the README. Both do all set-up on a fresh Debian 12 machine.
BUILD ?= build
JOBS ?= $(shell nproc)
DEB_PACKAGES := cmake g++ make pkg-config libxbyak-dev libzydis-dev googletest libgtest-dev libgmock-dev \
                libbenchmark-dev libdnnl-dev libcli11-dev nlohmann-json3-dev python3-venv python3-pip python3-dev
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all deps pyenv build demo test pip-check check fuzz fuzz-deps clean format

all: build

deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi

# Test-only Python: references for the crosscheck_formats test (numpy, ml_dtypes,
# gguf), and nanobind + pytest for the Python package (python/), which the build
# then compiles and CTest runs. Created once; a no-op while the stamp is newer
# than the pinned requirements. The C library itself never uses Python.
PYENV := $(BUILD)/pyenv
PYENV_STAMP := $(PYENV)/.installed
PY_REQUIREMENTS := tests/python/requirements.txt
TEST_PYTHON := $(abspath $(PYENV))/bin/python

$(PYENV_STAMP): $(PY_REQUIREMENTS) | deps
	python3 -m venv $(PYENV)
	$(PYENV)/bin/pip install -q --disable-pip-version-check -r $(PY_REQUIREMENTS)
	touch $@

pyenv: $(PYENV_STAMP)

$(BUILD)/CMakeCache.txt: $(PYENV_STAMP) | deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DMOEJIT_TEST_PYTHON=$(TEST_PYTHON)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	$(BUILD)/tools/moejit-bench --demo

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# `pip install .` into a fresh venv (what docs/PYTHON.md tells users), the README's
# import line from outside the source tree, then the package's pytest suite against
# that installed wheel (not the build tree's copy).
PIP_VENV := $(abspath $(BUILD))/pip-check
pip-check: deps
	rm -rf $(PIP_VENV)
	python3 -m venv $(PIP_VENV)
	$(PIP_VENV)/bin/pip install -q --disable-pip-version-check .
	cd / && $(PIP_VENV)/bin/python -c "import moejit; print(moejit.info())"
	$(PIP_VENV)/bin/pip install -q --disable-pip-version-check -r $(PY_REQUIREMENTS)
	cd / && PYTHONPATH= PYTHONDONTWRITEBYTECODE=1 $(PIP_VENV)/bin/python -m pytest -q -p no:cacheprovider \
	  $(CURDIR)/tests/python --installed-from $(PIP_VENV)

# Sanitizer builds (docs/RELIABILITY.md): the whole suite under ASan + LSan + UBSan,
# then the threaded suites under TSan. Own build directories; `make test` is untouched.
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
SAN_TYPE ?= RelWithDebInfo
TSAN_TARGETS := test_numerics test_dedup test_reliability_concurrency test_thread_pool
TSAN_TESTS := Async\.|Stats\.|Dedup\.|Deterministic|Concurrency\.|ThreadPool\.
check: deps pyenv
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=$(SAN_TYPE) -DMOEJIT_SANITIZE=address,undefined -DMOEJIT_BUILD_BENCH=OFF \
	  -DMOEJIT_TEST_PYTHON=$(TEST_PYTHON)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS)
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=$(SAN_TYPE) -DMOEJIT_SANITIZE=thread -DMOEJIT_BUILD_BENCH=OFF \
	  -DMOEJIT_BUILD_TOOLS=OFF
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target $(TSAN_TARGETS)
	TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
	  ctest --test-dir $(TSAN_BUILD) --output-on-failure -j $(JOBS) -R '$(TSAN_TESTS)'

# libFuzzer harnesses (clang 14) under ASan + UBSan, FUZZ_SECONDS each; crashing
# inputs land in tests/fuzz/corpus/<harness>/ (see tests/fuzz/run_fuzz.sh).
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_CC ?= clang-14
FUZZ_CXX ?= clang++-14
FUZZ_PACKAGES := clang-14 libclang-rt-14-dev
fuzz-deps: deps
	@missing=""; for p in $(FUZZ_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi

fuzz: fuzz-deps
	cmake -S . -B $(FUZZ_BUILD) -DCMAKE_C_COMPILER=$(FUZZ_CC) -DCMAKE_CXX_COMPILER=$(FUZZ_CXX) \
	  -DCMAKE_BUILD_TYPE=$(SAN_TYPE) -DMOEJIT_SANITIZE=address,undefined -DMOEJIT_FUZZ=ON \
	  -DMOEJIT_BUILD_BENCH=OFF -DMOEJIT_BUILD_TOOLS=OFF
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_formats fuzz_capi fuzz_tiles fuzz_formats_replay fuzz_capi_replay fuzz_tiles_replay
	tests/fuzz/run_fuzz.sh $(FUZZ_BUILD) $(FUZZ_SECONDS)

format:
	clang-format -i $$(git ls-files '*.h' '*.cpp' '*.c')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(FUZZ_BUILD)
