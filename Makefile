# Builds ./train and the tests. `make` works with or without a GPU; CUDA sources are compiled
# whenever nvcc is found (CI has nvcc and no GPU). `make test` runs the CPU test suite.
CC      ?= gcc
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CFLAGS  ?= -O2 -g
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -fopenmp -I. -MMD -MP
LDLIBS  += -lyaml -lzstd -lpcre2-8 -lm -fopenmp
BUILD   := build

# DEPS=.deps/root: headers and static libraries unpacked from Debian packages (scripts/fetch_deps.sh),
# for machines without libyaml-dev / libpcre2-dev / libzstd-dev (the GPU machine).
ifneq ($(strip $(DEPS)),)
CFLAGS  += -I$(DEPS)/usr/include
LDLIBS  := -L$(DEPS)/usr/lib/x86_64-linux-gnu -Wl,-Bstatic -lyaml -lzstd -lpcre2-8 -Wl,-Bdynamic -lm -fopenmp
endif

LIB_C   := common.c $(wildcard model/*.c) $(wildcard data/*.c) $(wildcard fp4/*.c)
LIB_OBJ := $(LIB_C:%.c=$(BUILD)/%.o)
TESTS   := $(patsubst tests/%.c,$(BUILD)/tests/%,$(wildcard tests/test_*.c)) \
           $(patsubst tests/%.cpp,$(BUILD)/tests/%,$(wildcard tests/test_*.cpp))

# CUDA: compiled for Hopper (sm_90a, what runs here) and Blackwell (sm_100a, compile-checked).
# model/*.cpp is the one C++ file behind cuDNN's header-only frontend (scripts/fetch_deps.sh).
CU_SRC  := $(wildcard model/*.cu) $(wildcard fp4/*.cu)
CPP_SRC := $(wildcard model/*.cpp)
GPU_TESTS :=
ifneq ($(strip $(NVCC)),)
ifneq ($(strip $(CU_SRC)),)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDNN_FE ?= .deps/cudnn_fe/include
CXX     ?= g++
NVFLAGS ?= -O3 -std=c++17 -I. -MMD -MP -Xcompiler -fopenmp -DHAVE_CUDA \
           -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_100a,code=sm_100a
CXXFLAGS_CUDNN := -O2 -std=c++17 -I. -I$(CUDA_HOME)/include -I$(CUDNN_FE) -DHAVE_CUDA -MMD -MP -Wall
CU_OBJ  := $(CU_SRC:%.cu=$(BUILD)/%.cu.o) $(CPP_SRC:%.cpp=$(BUILD)/%.cpp.o)
CFLAGS  += -DHAVE_CUDA -I$(CUDA_HOME)/include
LDLIBS  += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcudnn -lnvrtc -lcudart_static -ldl -lrt -lpthread -lstdc++
GPU_TESTS := $(patsubst tests/%.cu,$(BUILD)/gpu_tests/%,$(wildcard tests/gpu_test_*.cu))
ifeq ($(wildcard $(CUDNN_FE)/cudnn_frontend.h),)
$(error cuDNN frontend headers not found in $(CUDNN_FE): run scripts/fetch_deps.sh (or set CUDNN_FE=path/include))
endif
endif
endif

.PHONY: all test clean gpu-tests
all: train $(TESTS) $(GPU_TESTS)
gpu-tests: $(GPU_TESTS)

train: $(BUILD)/train.o $(BUILD)/run_ckpt.o $(BUILD)/libengine.a
	$(CC) -o $@ $^ $(LDLIBS)

$(BUILD)/libengine.a: $(LIB_OBJ) $(CU_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

# The FP4 quantizers must be bit-identical to their C references: no fused multiply-add contraction.
$(BUILD)/fp4/%.cu.o: NVFLAGS += -fmad=false
$(BUILD)/gpu_tests/gpu_test_fp4%: NVFLAGS += -fmad=false

$(BUILD)/%.cpp.o: %.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS_CUDNN) -c $< -o $@

# GPU tests: built everywhere nvcc is, run only on a GPU machine (scripts/gpu_check.sh).
$(BUILD)/gpu_tests/%: tests/%.cu $(BUILD)/libengine.a
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@.o
	$(CXX) -o $@ $@.o $(BUILD)/libengine.a $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(BUILD)/libengine.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libengine.a $(LDLIBS)

# C++ host tests (the GPU producers' templated rules, compiled for the CPU): no FMA contraction, as
# for the FP4 kernels, so the host forms round exactly as written.
$(BUILD)/tests/%: tests/%.cpp $(BUILD)/libengine.a
	@mkdir -p $(dir $@)
	$(CXX) -O2 -std=c++17 -ffp-contract=off -fopenmp -Wall -Wextra -I. -o $@ $< $(BUILD)/libengine.a $(LDLIBS)

test: all
	bash scripts/run_tests.sh

clean:
	rm -rf $(BUILD) train

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
