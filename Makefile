# Builds ./train and the tests. `make` works with or without a GPU; the CUDA backend is compiled
# whenever nvcc, cuDNN and cuDNN's frontend headers are there (CI has nvcc and no GPU). `make test`
# runs the CPU test suite. What the build or the tests lack is installed or fetched the first time
# (scripts/deps.sh); when that cannot be done, make stops before compiling and says what to install.
CC      ?= gcc
CXX     ?= g++
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDNN_FE ?= .deps/cudnn_fe/include
CUTLASS_HOME ?= .deps/cutlass
CFLAGS  ?= -O2 -g
# -ffp-contract=off here, -fmad=false for CUDA: every operation rounds as written (an FMA only where
# the code calls one), the rule that keeps the FP4 quantizers bit-identical to their C references
# and every fused kernel equal to its unfused twins. One rule for all code, CPU and GPU.
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -fopenmp -ffp-contract=off -I. -MMD -MP
LDLIBS  += -lyaml -lzstd -lpcre2-8 -lz -lm -fopenmp
BUILD   := build
# All cores unless -j is given.
MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 2)

# build/deps.mk (scripts/deps.sh build): DEPS_ROOT, CUDA_BUILD, CUDA_WHY, PARQUET_BUILD, PARQUET_WHY,
# ARROW_HOME, CUDNN_LIBDIR. DEPS=prefix takes the C libraries from an unpacked prefix (scripts/deps.sh fetch writes
# .deps/root; the GPU machine has no internet); without it the system's are used, or .deps/root when
# the system lacks them. PARQUET=0 builds no parquet reader.
ifeq ($(filter clean,$(MAKECMDGOALS)),)
DEPS_ENV := CC="$(CC)" CXX="$(CXX)" NVCC="$(NVCC)" CUDA_HOME="$(CUDA_HOME)" CUDNN_FE="$(CUDNN_FE)" DEPS="$(DEPS)" BUILD="$(BUILD)" \
            PARQUET="$(PARQUET)" CUDNN_LIBDIR="$(CUDNN_LIBDIR)"
DEPS_ENV += CUTLASS_HOME="$(CUTLASS_HOME)"
DEPS_OUT := $(shell $(DEPS_ENV) bash scripts/deps.sh build)
ifneq ($(.SHELLSTATUS),0)
$(error missing build dependencies (see above))
endif
ifneq ($(filter test,$(MAKECMDGOALS)),)
DEPS_OUT := $(shell $(DEPS_ENV) bash scripts/deps.sh test)
ifneq ($(.SHELLSTATUS),0)
$(error missing test dependencies (see above))
endif
endif
include $(BUILD)/deps.mk
endif

# Unpacked C libraries: their headers, and their static libraries (no runtime copies needed).
ifneq ($(strip $(DEPS_ROOT)),)
CFLAGS  += -I$(DEPS_ROOT)/usr/include
LDLIBS  := -L$(DEPS_ROOT)/usr/lib/$(shell $(CC) -dumpmachine) -Wl,-Bstatic -lyaml -lzstd -lpcre2-8 -lz -Wl,-Bdynamic -lm -fopenmp
endif

# Parquet inputs to ./train tokenize (optional, like the CUDA backend): data/parquet_text.cc over
# Apache Arrow's C++ libraries (scripts/deps.sh unpacks them from the pyarrow wheel into ARROW_HOME),
# built as a shared library with an rpath to them, which ./train dlopens when it meets a .parquet
# input (data/text_input.c). Without it, .parquet inputs are refused saying why.
PQ_SO   :=
ifeq ($(PARQUET_BUILD),1)
PQ_SO   := $(BUILD)/libparquet_text.so
CFLAGS  += -DHAVE_PARQUET -DPARQUET_TEXT_SO='"$(abspath $(PQ_SO))"'
LDLIBS  += -ldl
else ifneq ($(strip $(PARQUET_WHY)),)
$(info note: ./train tokenize reads no parquet: $(PARQUET_WHY))
endif

LIB_C   := $(wildcard common/*.c fp4/*.c model/*.c model/cpu/*.c parallel/*.c run/*.c data/*.c)
LIB_OBJ := $(LIB_C:%.c=$(BUILD)/%.o)
TESTS   := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(wildcard tests/unit/test_*.c)) \
           $(patsubst tests/unit/%.cpp,$(BUILD)/tests/%,$(wildcard tests/unit/test_*.cpp))

# CUDA: compiled for Hopper (sm_90a, what runs here) and Blackwell (sm_100a, compile-checked).
# CUDA_ARCHS=90a builds Hopper's alone (scripts/gpu/gpu_check.sh on the H200 machine, where only it runs).
CUDA_ARCHS ?= 90a 100a
# model/cuda/*.cpp is the one C++ file behind cuDNN's header-only frontend (scripts/deps.sh fetches it).
CU_SRC  := $(wildcard common/*.cu fp4/*.cu model/cuda/*.cu parallel/*.cu)
CPP_SRC := $(wildcard model/cuda/*.cpp)
GPU_TESTS :=
ifeq ($(CUDA_BUILD),1)
ifneq ($(strip $(CU_SRC)),)
NVFLAGS ?= -O3 -std=c++17 -fmad=false -I. -MMD -MP -Xcompiler -fopenmp -DHAVE_CUDA \
           $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a))
CXXFLAGS_CUDNN := -O2 -std=c++17 -ffp-contract=off -I. -I$(CUDA_HOME)/include -I$(CUDNN_FE) -DHAVE_CUDA -MMD -MP -Wall
CU_OBJ  := $(CU_SRC:%.cu=$(BUILD)/%.cu.o) $(CPP_SRC:%.cpp=$(BUILD)/%.cpp.o)
CFLAGS  += -DHAVE_CUDA -I$(CUDA_HOME)/include
# the newest cuDNN 9 found (CUDNN_LIBDIR in deps.mk, scripts/deps.sh) first in the run path
ifneq ($(filter-out system,$(CUDNN_LIBDIR)),)
LDLIBS  += -Wl,-rpath,$(CUDNN_LIBDIR)
endif
LDLIBS  += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcudnn -lnvrtc -lcudart_static -ldl -lrt -lpthread -lstdc++
GPU_TESTS := $(patsubst tests/gpu/%.cu,$(BUILD)/gpu_tests/%,$(wildcard tests/gpu/gpu_test_*.cu))
endif
else ifneq ($(strip $(NVCC)),)
$(info note: the CUDA backend is not built, ./train runs on the CPU only: $(CUDA_WHY))
endif

.PHONY: all test clean gpu-tests
all: train $(TESTS) $(GPU_TESTS) $(PQ_SO)
gpu-tests: $(GPU_TESTS)

# CUTLASS, header-only, for fp4/gemm_cutlass.cu and model/cuda/swiglu_epilogue.cu (scripts/deps.sh unpacks it into .deps/cutlass;
# CUTLASS_HOME=dir takes another copy); without it that file builds a stub that says so. CUTLASS's
# headers need --expt-relaxed-constexpr, and NDEBUG: a device assert is a call, across which ptxas
# serializes the wgmma pipeline (warning C7510).
ifeq ($(CUDA_BUILD),1)
ifneq ($(wildcard $(CUTLASS_HOME)/include/cutlass/cutlass.h),)
CUTLASS_OBJS := $(BUILD)/fp4/gemm_cutlass.cu.o $(BUILD)/model/cuda/swiglu_epilogue.cu.o
$(CUTLASS_OBJS): NVFLAGS += -DFP4_HAVE_CUTLASS -DNDEBUG -I$(CUTLASS_HOME)/include --expt-relaxed-constexpr
$(CUTLASS_OBJS): $(CUTLASS_HOME)/include/cutlass/version.h
else
$(info note: no CUTLASS in $(CUTLASS_HOME)/include (scripts/deps.sh fetch gets it): fp4_gemm fp8 keeps cuBLASLt on every shape)
endif
endif

train: $(BUILD)/train.o $(BUILD)/libengine.a | $(PQ_SO)
	$(CC) -o $@ $^ $(LDLIBS)

$(BUILD)/libengine.a: $(LIB_OBJ) $(CU_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/%.o: %.c $(BUILD)/deps.mk
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.cu.o: %.cu $(BUILD)/deps.mk
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

ifeq ($(PARQUET_BUILD),1)
$(PQ_SO): data/parquet_text.cc $(BUILD)/deps.mk
	$(CXX) -O2 -std=c++17 -Wall -fPIC -shared -I. -I$(ARROW_HOME)/include -MMD -MP -o $@ $< \
	  -L$(ARROW_HOME)/lib -Wl,-rpath,$(abspath $(ARROW_HOME)/lib) -lparquet -larrow
endif

$(BUILD)/%.cpp.o: %.cpp $(BUILD)/deps.mk
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS_CUDNN) -c $< -o $@

# GPU tests: built everywhere nvcc is, run only on a GPU machine (scripts/gpu/gpu_check.sh).
$(BUILD)/gpu_tests/%: tests/gpu/%.cu $(BUILD)/libengine.a
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@.o
	$(CXX) -o $@ $@.o $(BUILD)/libengine.a $(LDLIBS)

# The producers' GPU test with line info in the MXFP4 kernels, for Nsight Compute's per-source-line view
# (NCU_SOURCE=1 NCU_LINEINFO_BIN=build/prof/gpu_test_fp4_mx_lineinfo scripts/gpu/ncu_producers.sh); not in `all`.
$(BUILD)/prof/gpu_test_fp4_mx_lineinfo: $(BUILD)/gpu_tests/gpu_test_fp4_mx fp4/mxfp4.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -lineinfo -c fp4/mxfp4.cu -o $@.mxfp4.o
	$(CXX) -o $@ $(BUILD)/gpu_tests/gpu_test_fp4_mx.o $@.mxfp4.o $(BUILD)/libengine.a $(LDLIBS)

$(BUILD)/tests/%: tests/unit/%.c $(BUILD)/libengine.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libengine.a $(LDLIBS)

# C++ host tests (the GPU producers' templated rules, compiled for the CPU): no FMA contraction, as
# for the FP4 kernels, so the host forms round exactly as written.
$(BUILD)/tests/%: tests/unit/%.cpp $(BUILD)/libengine.a
	@mkdir -p $(dir $@)
	$(CXX) -O2 -std=c++17 -ffp-contract=off -fopenmp -Wall -Wextra -I. -o $@ $< $(BUILD)/libengine.a $(LDLIBS)

test: all
	DEPS_ROOT="$(DEPS_ROOT)" bash scripts/run_tests.sh

clean:
	rm -rf $(BUILD) train

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
