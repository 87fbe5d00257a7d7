/* ai.portkern::TvmKernel: a TVM-compiled kernel as an onnxruntime custom op (inline.py says why).
 *
 * Attributes: library (the kernel's shared library), arg_ranks and arg_dims (each argument's
 * shape as the kernel takes it, inputs then outputs), out_ranks and out_dims (each output's shape
 * in the graph), threads (tasks for a parallel loop launched with "any number").
 *
 * onnxruntime's C API is reached through its function table by index: the indices and the
 * OrtCustomOp layout below are onnxruntime's stable ABI (append-only since API 1), written here
 * as plain pointers so no onnxruntime header is needed to build. The kernel's library is called
 * through its packed entry point (__tvm_ffi_main) with DLTensor arguments; its runtime services
 * are this file's: parallel loops on onnxruntime's intra-op pool, workspaces kept per thread
 * and reused by size.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tvm/runtime/c_backend_api.h>

/* ---- onnxruntime ABI ---------------------------------------------------------------------- */
typedef void OrtStatus;
typedef const void* const* OrtApiTable;
typedef struct {
  OrtApiTable (*GetApi)(uint32_t version);
  const char* (*GetVersionString)(void);
} OrtApiBase;

enum { ORT_API_FOR_PARALLEL_FOR = 17, ORT_FAIL = 1, ORT_INVALID_ARGUMENT = 2 };
enum { ELEM_FLOAT = 1, ELEM_UINT8 = 2, ELEM_INT8 = 3, ELEM_INT32 = 6, ELEM_INT64 = 7, ELEM_BOOL = 9,
       ELEM_FLOAT16 = 10, ELEM_DOUBLE = 11 };
enum { IO_VARIADIC = 2 };

/* OrtApi member indices */
enum {
  API_CreateStatus = 0, API_CreateCustomOpDomain = 26, API_CustomOpDomain_Add = 27, API_AddCustomOpDomain = 28,
  API_GetTensorMutableData = 51, API_GetTensorElementType = 60, API_GetTensorShapeElementCount = 64,
  API_GetTensorTypeAndShape = 65, API_KernelInfoGetAttribute_int64 = 86, API_KernelInfoGetAttribute_string = 87,
  API_KernelContext_GetInputCount = 88, API_KernelContext_GetOutputCount = 89, API_KernelContext_GetInput = 90,
  API_KernelContext_GetOutput = 91, API_ReleaseStatus = 93, API_ReleaseTensorTypeAndShapeInfo = 99,
  API_KernelInfoGetAttributeArray_int64 = 163, API_KernelContext_ParallelFor = 274,
};
#define ORT(name, type) ((type)ort_api[API_##name])

typedef OrtStatus* (*CreateStatusFn)(int code, const char* message);
typedef OrtStatus* (*CreateCustomOpDomainFn)(const char* domain, void** out);
typedef OrtStatus* (*CustomOpDomainAddFn)(void* domain, const void* op);
typedef OrtStatus* (*AddCustomOpDomainFn)(void* options, void* domain);
typedef OrtStatus* (*GetTensorMutableDataFn)(void* value, void** out);
typedef OrtStatus* (*GetTensorElementTypeFn)(const void* info, int* out);
typedef OrtStatus* (*GetTensorShapeElementCountFn)(const void* info, size_t* out);
typedef OrtStatus* (*GetTensorTypeAndShapeFn)(const void* value, void** out);
typedef OrtStatus* (*AttributeInt64Fn)(const void* info, const char* name, int64_t* out);
typedef OrtStatus* (*AttributeStringFn)(const void* info, const char* name, char* out, size_t* size);
typedef OrtStatus* (*AttributeInt64ArrayFn)(const void* info, const char* name, int64_t* out, size_t* size);
typedef OrtStatus* (*ContextCountFn)(const void* context, size_t* out);
typedef OrtStatus* (*ContextGetInputFn)(const void* context, size_t index, const void** out);
typedef OrtStatus* (*ContextGetOutputFn)(void* context, size_t index, const int64_t* dims, size_t rank, void** out);
typedef void (*ReleaseFn)(void* object);
typedef OrtStatus* (*ParallelForFn)(const void* context, void (*fn)(void*, size_t), size_t total, size_t num_batch,
                                    void* data);

typedef struct CustomOp CustomOp;
struct CustomOp { /* OrtCustomOp as of version 16 */
  uint32_t version;
  void* (*CreateKernel)(const CustomOp*, OrtApiTable, const void*);
  const char* (*GetName)(const CustomOp*);
  const char* (*GetExecutionProviderType)(const CustomOp*);
  int (*GetInputType)(const CustomOp*, size_t);
  size_t (*GetInputTypeCount)(const CustomOp*);
  int (*GetOutputType)(const CustomOp*, size_t);
  size_t (*GetOutputTypeCount)(const CustomOp*);
  void (*KernelCompute)(void*, void*);
  void (*KernelDestroy)(void*);
  int (*GetInputCharacteristic)(const CustomOp*, size_t);
  int (*GetOutputCharacteristic)(const CustomOp*, size_t);
  int (*GetInputMemoryType)(const CustomOp*, size_t);
  int (*GetVariadicInputMinArity)(const CustomOp*);
  int (*GetVariadicInputHomogeneity)(const CustomOp*);
  int (*GetVariadicOutputMinArity)(const CustomOp*);
  int (*GetVariadicOutputHomogeneity)(const CustomOp*);
  OrtStatus* (*CreateKernelV2)(const CustomOp*, OrtApiTable, const void*, void**);
  OrtStatus* (*KernelComputeV2)(void*, void*);
};

static OrtApiTable ort_api;

/* ---- TVM runtime services ----------------------------------------------------------------- */
enum { MAX_ARGS = 64, MAX_RANK = 8, ALIGNMENT = 64 };

/* The kernel context of the op running on this thread: its parallel loops go to that context's pool. */
static __thread void* current_context;
static __thread int64_t current_threads;

typedef struct {
  FTVMParallelLambda lambda;
  void* closure;
  TVMParallelGroupEnv env;
  volatile int failed;
} Launch;

static void run_task(void* data, size_t task) {
  Launch* launch = data;
  if (launch->lambda((int)task, &launch->env, launch->closure) != 0) launch->failed = 1;
}

static int parallel_launch(FTVMParallelLambda lambda, void* closure, int num_task) {
  int64_t tasks = num_task > 0 ? num_task : (current_threads > 0 ? current_threads : 1);
  Launch launch = {lambda, closure, {NULL, (int32_t)tasks}, 0};
  OrtStatus* status = NULL;
  if (current_context != NULL && tasks > 1) {
    status = ORT(KernelContext_ParallelFor, ParallelForFn)(current_context, run_task, (size_t)tasks, 0, &launch);
  }
  if (current_context == NULL || tasks <= 1 || status != NULL) {
    if (status != NULL) ORT(ReleaseStatus, ReleaseFn)(status); /* no pool here: the tasks run in turn */
    for (int64_t task = 0; task < tasks; ++task) run_task(&launch, (size_t)task);
  }
  return launch.failed ? -1 : 0;
}

/* Workspaces are kept per thread and handed out again by size, never given back: a kernel asks
 * for the same sizes on every run, and a block from malloc would be mapped and faulted in afresh
 * each time (shufflenet's ~20 kernels with packed weights ran 3.4x slower with a 16-block cache
 * that evicted). What a thread keeps is what one run of the model's kernels needs at once, as
 * TVM's own workspace pool keeps it. */
typedef struct {
  void* block;
  uint64_t size;
  int in_use;
} Workspace;

static __thread Workspace* workspaces;
static __thread size_t workspace_count, workspace_capacity;

static void* alloc_workspace(int device_type, int device_id, uint64_t size, int code_hint, int bits_hint) {
  (void)device_type, (void)device_id, (void)code_hint, (void)bits_hint;
  for (size_t i = 0; i < workspace_count; ++i) {
    if (!workspaces[i].in_use && workspaces[i].size == size) {
      workspaces[i].in_use = 1;
      return workspaces[i].block;
    }
  }
  if (workspace_count == workspace_capacity) {
    size_t capacity = workspace_capacity ? 2 * workspace_capacity : 16;
    Workspace* grown = realloc(workspaces, capacity * sizeof(Workspace));
    if (grown == NULL) return NULL;
    workspaces = grown;
    workspace_capacity = capacity;
  }
  void* block = NULL;
  if (posix_memalign(&block, ALIGNMENT, size ? size : 1) != 0) return NULL;
  workspaces[workspace_count++] = (Workspace){block, size, 1};
  return block;
}

static int free_workspace(int device_type, int device_id, void* block) {
  (void)device_type, (void)device_id;
  for (size_t i = 0; i < workspace_count; ++i) {
    if (workspaces[i].block == block) {
      workspaces[i].in_use = 0;
      return 0;
    }
  }
  return -1; /* not a block of this thread's */
}

/* ---- the kernel --------------------------------------------------------------------------- */
typedef int (*PackedCall)(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result);

typedef struct {
  void* library;
  PackedCall call;
  char path[4096];
  int num_args;
  int64_t ranks[MAX_ARGS];
  int64_t dims[MAX_ARGS][MAX_RANK];
  int64_t out_ranks[MAX_ARGS];
  int64_t out_dims[MAX_ARGS][MAX_RANK];
  int64_t threads;
} Kernel;

static OrtStatus* fail(int code, const char* format, const char* detail) {
  char message[4608];
  snprintf(message, sizeof message, format, detail);
  return ORT(CreateStatus, CreateStatusFn)(code, message);
}

/* A flattened list of shapes (ranks, then every dim in order) into a table of shapes. */
static OrtStatus* read_shapes(const void* info, const char* ranks_name, const char* dims_name, int64_t* ranks,
                              int64_t (*dims)[MAX_RANK], int* count) {
  int64_t flat[MAX_ARGS * MAX_RANK];
  size_t n_ranks = MAX_ARGS, n_dims = MAX_ARGS * MAX_RANK;
  OrtStatus* status = ORT(KernelInfoGetAttributeArray_int64, AttributeInt64ArrayFn)(info, ranks_name, ranks, &n_ranks);
  if (status == NULL) status = ORT(KernelInfoGetAttributeArray_int64, AttributeInt64ArrayFn)(info, dims_name, flat, &n_dims);
  if (status != NULL) return status;
  size_t at = 0;
  for (size_t i = 0; i < n_ranks; ++i) {
    if (ranks[i] < 0 || ranks[i] > MAX_RANK || at + (size_t)ranks[i] > n_dims) {
      return fail(ORT_INVALID_ARGUMENT, "TvmKernel: attribute %s does not match its ranks", dims_name);
    }
    for (int64_t d = 0; d < ranks[i]; ++d) dims[i][d] = flat[at++];
  }
  *count = (int)n_ranks;
  return NULL;
}

static OrtStatus* create_kernel(const CustomOp* op, OrtApiTable api, const void* info, void** out) {
  (void)op, (void)api;
  Kernel* kernel = calloc(1, sizeof(Kernel));
  if (kernel == NULL) return fail(ORT_FAIL, "TvmKernel: %s", "out of memory");
  size_t size = sizeof kernel->path;
  int outputs = 0;
  OrtStatus* status = ORT(KernelInfoGetAttribute_string, AttributeStringFn)(info, "library", kernel->path, &size);
  if (status == NULL) status = read_shapes(info, "arg_ranks", "arg_dims", kernel->ranks, kernel->dims, &kernel->num_args);
  if (status == NULL) status = read_shapes(info, "out_ranks", "out_dims", kernel->out_ranks, kernel->out_dims, &outputs);
  if (status == NULL) status = ORT(KernelInfoGetAttribute_int64, AttributeInt64Fn)(info, "threads", &kernel->threads);
  if (status != NULL) {
    free(kernel);
    return status;
  }
  kernel->library = dlopen(kernel->path, RTLD_NOW | RTLD_LOCAL);
  if (kernel->library == NULL) {
    status = fail(ORT_FAIL, "TvmKernel: cannot load the kernel: %s", dlerror());
    free(kernel);
    return status;
  }
  kernel->call = (PackedCall)dlsym(kernel->library, "__tvm_ffi_main");
  void** launch = dlsym(kernel->library, "__TVMBackendParallelLaunch");
  void** alloc = dlsym(kernel->library, "__TVMBackendAllocWorkspace");
  void** release = dlsym(kernel->library, "__TVMBackendFreeWorkspace");
  if (kernel->call == NULL) {
    dlclose(kernel->library);
    status = fail(ORT_FAIL, "TvmKernel: %s has no __tvm_ffi_main", kernel->path);
    free(kernel);
    return status;
  }
  if (launch != NULL) *launch = (void*)parallel_launch;
  if (alloc != NULL) *alloc = (void*)alloc_workspace;
  if (release != NULL) *release = (void*)free_workspace;
  *out = kernel;
  return NULL;
}

static void destroy_kernel(void* data) {
  Kernel* kernel = data;
  dlclose(kernel->library);
  free(kernel);
}

static int dl_type(int element, DLDataType* out) {
  switch (element) {
    case ELEM_FLOAT: *out = (DLDataType){kDLFloat, 32, 1}; return 1;
    case ELEM_FLOAT16: *out = (DLDataType){kDLFloat, 16, 1}; return 1;
    case ELEM_DOUBLE: *out = (DLDataType){kDLFloat, 64, 1}; return 1;
    case ELEM_INT64: *out = (DLDataType){kDLInt, 64, 1}; return 1;
    case ELEM_INT32: *out = (DLDataType){kDLInt, 32, 1}; return 1;
    case ELEM_INT8: *out = (DLDataType){kDLInt, 8, 1}; return 1;
    case ELEM_UINT8: *out = (DLDataType){kDLUInt, 8, 1}; return 1;
    case ELEM_BOOL: *out = (DLDataType){kDLBool, 8, 1}; return 1;
    default: return 0;
  }
}

static int64_t elements(const int64_t* dims, int64_t rank) {
  int64_t count = 1;
  for (int64_t d = 0; d < rank; ++d) count *= dims[d];
  return count;
}

/* The input's data, its dtype and element count; an input whose data is not 64-byte aligned (a
 * feed bound by pointer) is copied into `*copy`, since TVM's vector loads assume the alignment. */
static OrtStatus* input_tensor(void* context, size_t index, DLTensor* tensor, size_t* count, void** copy) {
  const void* value = NULL;
  void* info = NULL;
  int element = 0;
  OrtStatus* status = ORT(KernelContext_GetInput, ContextGetInputFn)(context, index, &value);
  if (status == NULL) status = ORT(GetTensorTypeAndShape, GetTensorTypeAndShapeFn)(value, &info);
  if (status == NULL) status = ORT(GetTensorElementType, GetTensorElementTypeFn)(info, &element);
  if (status == NULL) status = ORT(GetTensorShapeElementCount, GetTensorShapeElementCountFn)(info, count);
  if (info != NULL) ORT(ReleaseTensorTypeAndShapeInfo, ReleaseFn)(info);
  if (status == NULL) status = ORT(GetTensorMutableData, GetTensorMutableDataFn)((void*)value, &tensor->data);
  if (status != NULL) return status;
  if (!dl_type(element, &tensor->dtype)) return fail(ORT_INVALID_ARGUMENT, "TvmKernel: input %s has an unsupported type", "");
  if ((uintptr_t)tensor->data % ALIGNMENT != 0) {
    size_t bytes = *count * ((tensor->dtype.bits + 7) / 8);
    if (posix_memalign(copy, ALIGNMENT, bytes ? bytes : 1) != 0) return fail(ORT_FAIL, "TvmKernel: %s", "out of memory");
    memcpy(*copy, tensor->data, bytes);
    tensor->data = *copy;
  }
  return NULL;
}

static OrtStatus* compute(void* data, void* context) {
  Kernel* kernel = data;
  size_t inputs = 0, outputs = 0;
  OrtStatus* status = ORT(KernelContext_GetInputCount, ContextCountFn)(context, &inputs);
  if (status == NULL) status = ORT(KernelContext_GetOutputCount, ContextCountFn)(context, &outputs);
  if (status != NULL) return status;
  if ((int)(inputs + outputs) != kernel->num_args) {
    return fail(ORT_INVALID_ARGUMENT, "TvmKernel: the node's inputs and outputs do not match %s", kernel->path);
  }
  DLTensor tensors[MAX_ARGS];
  TVMFFIAny args[MAX_ARGS];
  void* copies[MAX_ARGS] = {0};
  for (int i = 0; i < kernel->num_args && status == NULL; ++i) {
    DLTensor* tensor = &tensors[i];
    memset(tensor, 0, sizeof *tensor);
    tensor->device = (DLDevice){kDLCPU, 0};
    tensor->ndim = (int32_t)kernel->ranks[i];
    tensor->shape = kernel->dims[i];
    size_t count = 0;
    if ((size_t)i < inputs) {
      status = input_tensor(context, (size_t)i, tensor, &count, &copies[i]);
    } else {
      size_t out = (size_t)i - inputs;
      void* value = NULL;
      status = ORT(KernelContext_GetOutput, ContextGetOutputFn)(context, out, kernel->out_dims[out],
                                                                (size_t)kernel->out_ranks[out], &value);
      if (status == NULL) status = ORT(GetTensorMutableData, GetTensorMutableDataFn)(value, &tensor->data);
      tensor->dtype = (DLDataType){kDLFloat, 32, 1};
      count = (size_t)elements(kernel->out_dims[out], kernel->out_ranks[out]);
    }
    if (status == NULL && (int64_t)count != elements(tensor->shape, tensor->ndim)) {
      status = fail(ORT_INVALID_ARGUMENT, "TvmKernel: a buffer's size does not match the shape %s takes", kernel->path);
    }
    args[i].type_index = kTVMFFIDLTensorPtr;
    args[i].zero_padding = 0;
    args[i].v_ptr = tensor;
  }
  if (status == NULL) {
    TVMFFIAny result;
    memset(&result, 0, sizeof result);
    result.type_index = kTVMFFINone;
    current_context = context;
    current_threads = kernel->threads;
    int code = kernel->call(NULL, args, kernel->num_args, &result);
    current_context = NULL;
    if (code != 0) status = fail(ORT_FAIL, "TvmKernel: the kernel in %s raised an error", kernel->path);
  }
  for (int i = 0; i < kernel->num_args; ++i) free(copies[i]);
  return status;
}

/* ---- the op and its registration ---------------------------------------------------------- */
static const char* op_name(const CustomOp* op) { (void)op; return "TvmKernel"; }
static const char* op_provider(const CustomOp* op) { (void)op; return NULL; } /* the CPU provider */
static int op_input_type(const CustomOp* op, size_t i) { (void)op, (void)i; return 0; } /* any */
static int op_output_type(const CustomOp* op, size_t i) { (void)op, (void)i; return ELEM_FLOAT; }
static size_t op_one(const CustomOp* op) { (void)op; return 1; }
static int op_variadic(const CustomOp* op, size_t i) { (void)op, (void)i; return IO_VARIADIC; }
static int op_memory(const CustomOp* op, size_t i) { (void)op, (void)i; return 0; }
static int op_min_arity(const CustomOp* op) { (void)op; return 1; }
static int op_mixed(const CustomOp* op) { (void)op; return 0; }
static int op_uniform(const CustomOp* op) { (void)op; return 1; }

static const CustomOp tvm_kernel_op = {
  .version = 16,
  .GetName = op_name,
  .GetExecutionProviderType = op_provider,
  .GetInputType = op_input_type,
  .GetInputTypeCount = op_one,
  .GetOutputType = op_output_type,
  .GetOutputTypeCount = op_one,
  .KernelDestroy = destroy_kernel,
  .GetInputCharacteristic = op_variadic,
  .GetOutputCharacteristic = op_variadic,
  .GetInputMemoryType = op_memory,
  .GetVariadicInputMinArity = op_min_arity,
  .GetVariadicInputHomogeneity = op_mixed,
  .GetVariadicOutputMinArity = op_min_arity,
  .GetVariadicOutputHomogeneity = op_uniform,
  .CreateKernelV2 = create_kernel,
  .KernelComputeV2 = compute,
};

static pthread_once_t domain_once = PTHREAD_ONCE_INIT;
static void* domain;
static OrtStatus* domain_status;

static void make_domain(void) {
  domain_status = ORT(CreateCustomOpDomain, CreateCustomOpDomainFn)("ai.portkern", &domain);
  if (domain_status == NULL) domain_status = ORT(CustomOpDomain_Add, CustomOpDomainAddFn)(domain, &tvm_kernel_op);
}

/* onnxruntime's entry point for SessionOptions.register_custom_ops_library. One domain serves
 * every session of the process; it lives as long as the process. */
OrtStatus* RegisterCustomOps(void* options, const OrtApiBase* base) {
  if (ort_api == NULL) ort_api = base->GetApi(ORT_API_FOR_PARALLEL_FOR);
  if (ort_api == NULL) return NULL; /* cannot even report: onnxruntime older than 1.17 */
  pthread_once(&domain_once, make_domain);
  if (domain_status != NULL) return fail(ORT_FAIL, "TvmKernel: %s", "the custom op domain could not be made");
  return ORT(AddCustomOpDomain, AddCustomOpDomainFn)(options, domain);
}
