// The device expert arena (CUDA builds): VMM allocations exported as POSIX fds, or legacy
// CUDA IPC handles; and their import in a client process. The driver API is reached through
// cudaGetDriverEntryPointByVersion, so the binaries do not link libcuda and still start on
// machines without a GPU driver.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "expertstore_svc/arena.h"
#include "kernels/exec.h"
#include "kernels/linear/linear_cuda.h"

namespace dsflash::expertstore {
namespace {

Status cuda_error(cudaError_t e, const char* what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

// The driver functions the arena needs.
struct Driver {
  PFN_cuDeviceGetAttribute_v2000 device_attribute = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 granularity = nullptr;
  PFN_cuMemCreate_v10020 create = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  PFN_cuMemAddressReserve_v10020 reserve = nullptr;
  PFN_cuMemAddressFree_v10020 address_free = nullptr;
  PFN_cuMemMap_v10020 map = nullptr;
  PFN_cuMemUnmap_v10020 unmap = nullptr;
  PFN_cuMemSetAccess_v10020 set_access = nullptr;
  PFN_cuMemExportToShareableHandle_v10020 export_handle = nullptr;
  PFN_cuMemImportFromShareableHandle_v10020 import_handle = nullptr;
  PFN_cuGetErrorString_v6000 error_string = nullptr;
  Status status;
};

template <typename F>
Status entry(const char* name, F* out) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q{};
  const cudaError_t e = cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q);
  if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || p == nullptr) {
    return absl::UnavailableError(absl::StrCat("CUDA driver entry point ", name, " unavailable"));
  }
  *out = reinterpret_cast<F>(p);
  return absl::OkStatus();
}

const Driver& driver() {
  static Driver d;
  static std::once_flag once;
  std::call_once(once, [] {
    for (Status s : {entry("cuDeviceGetAttribute", &d.device_attribute), entry("cuMemGetAllocationGranularity", &d.granularity),
                     entry("cuMemCreate", &d.create), entry("cuMemRelease", &d.release),
                     entry("cuMemAddressReserve", &d.reserve), entry("cuMemAddressFree", &d.address_free),
                     entry("cuMemMap", &d.map), entry("cuMemUnmap", &d.unmap), entry("cuMemSetAccess", &d.set_access),
                     entry("cuMemExportToShareableHandle", &d.export_handle),
                     entry("cuMemImportFromShareableHandle", &d.import_handle), entry("cuGetErrorString", &d.error_string)}) {
      if (!s.ok() && d.status.ok()) d.status = s;
    }
  });
  return d;
}

Status cu(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return absl::OkStatus();
  const char* msg = "unknown error";
  if (driver().error_string) driver().error_string(r, &msg);
  return absl::UnavailableError(absl::StrCat(what, ": ", msg, " (", static_cast<int>(r), ")"));
}

CUmemAllocationProp vmm_prop(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

// Reserves an address range for `handle` and maps it with the given access.
StatusOr<CUdeviceptr> map_handle(CUmemGenericAllocationHandle handle, size_t size, size_t align, int device,
                                 CUmemAccess_flags access) {
  const Driver& d = driver();
  CUdeviceptr ptr = 0;
  RETURN_IF_ERROR(cu(d.reserve(&ptr, size, align, 0, 0), "cuMemAddressReserve"));
  Status s = cu(d.map(ptr, size, 0, handle, 0), "cuMemMap");
  if (s.ok()) {
    CUmemAccessDesc acc{};
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = device;
    acc.flags = access;
    s = cu(d.set_access(ptr, size, &acc, 1), "cuMemSetAccess");
    if (!s.ok()) d.unmap(ptr, size);
  }
  if (!s.ok()) {
    d.address_free(ptr, size);
    return s;
  }
  return ptr;
}

// Copies through one stream and event per thread (H2D from pinned staging, then waits), and
// the device scratch a tiled copy lands in before its reorder into the slot.
struct CopyStream {
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
};

class DeviceArena final : public Arena {
 public:
  ~DeviceArena() override {
    const Driver& d = driver();
    if (fd_ >= 0) ::close(fd_);
    if (vmm_) {
      d.unmap(ptr_, size_);
      d.address_free(ptr_, size_);
      d.release(handle_);
    } else if (ptr_) {
      cudaFree(reinterpret_cast<void*>(ptr_));
    }
  }
  std::string mechanism() const override { return vmm_ ? "cuda-vmm-fd" : "cuda-ipc"; }
  uint64_t bytes() const override { return size_; }
  int fd() const override { return fd_; }
  std::string ipc_handle() const override { return ipc_; }
  uint8_t* host_data() const override { return nullptr; }
  uint8_t* device_data() const override { return reinterpret_cast<uint8_t*>(ptr_); }
  Status copy_in(uint64_t offset, const uint8_t* src, size_t n) override {
    if (offset + n > size_) return absl::InternalError("copy past the end of the device arena");
    ASSIGN_OR_RETURN(CopyStream * cs, copy_stream());
    cudaError_t e = cudaMemcpyAsync(reinterpret_cast<void*>(ptr_ + offset), src, n, cudaMemcpyHostToDevice, cs->stream);
    return finish(*cs, e, "H2D copy into the expert arena");
  }
  Status copy_in_tiles(uint64_t offset, const kernels::Weight& w) override {
    const size_t n = static_cast<size_t>(w.rows) * w.row_bytes;
    if (offset + n > size_) return absl::InternalError("copy past the end of the device arena");
    ASSIGN_OR_RETURN(CopyStream * cs, copy_stream());
    if (cs->scratch_bytes < n) {  // grown to the largest slice, kept for the thread's life
      if (cs->scratch != nullptr) cudaFree(cs->scratch);
      cs->scratch = nullptr, cs->scratch_bytes = 0;
      const cudaError_t e = cudaMalloc(&cs->scratch, n);
      if (e != cudaSuccess) return cuda_error(e, "cudaMalloc of the tile reorder's scratch");
      cs->scratch_bytes = n;
    }
    cudaError_t e = cudaMemcpyAsync(cs->scratch, w.data, n, cudaMemcpyHostToDevice, cs->stream);
    if (e != cudaSuccess) return cuda_error(e, "H2D copy for the expert arena");
    kernels::Weight src = w;
    src.data = static_cast<const uint8_t*>(cs->scratch);
    RETURN_IF_ERROR(kernels::to_tiles_cuda(kernels::ExecCtx{kernels::Backend::kCuda, cs->stream}, src,
                                           reinterpret_cast<uint8_t*>(ptr_ + offset)));
    return finish(*cs, cudaSuccess, "tile reorder into the expert arena");
  }
  Status pin(void* p, size_t n) override {
    cudaSetDevice(device_);
    const cudaError_t e = cudaHostRegister(p, n, cudaHostRegisterDefault);
    return e == cudaSuccess ? absl::OkStatus() : cuda_error(e, "cudaHostRegister of a staging buffer");
  }
  void unpin(void* p, size_t) override { cudaHostUnregister(p); }

  // This thread's copy stream, made on first use.
  StatusOr<CopyStream*> copy_stream() {
    thread_local CopyStream cs;
    if (cs.stream == nullptr) {
      cudaSetDevice(device_);
      if (cudaStreamCreateWithFlags(&cs.stream, cudaStreamNonBlocking) != cudaSuccess ||
          cudaEventCreateWithFlags(&cs.done, cudaEventDisableTiming) != cudaSuccess) {
        return absl::UnavailableError("cannot create the copy stream");
      }
    }
    return &cs;
  }
  // Waits for what cs's stream was given (after e, the last call's result).
  static Status finish(CopyStream& cs, cudaError_t e, const char* what) {
    if (e == cudaSuccess) e = cudaEventRecord(cs.done, cs.stream);
    if (e == cudaSuccess) e = cudaEventSynchronize(cs.done);
    return e == cudaSuccess ? absl::OkStatus() : cuda_error(e, what);
  }

  bool vmm_ = false;
  int device_ = 0, fd_ = -1;
  CUdeviceptr ptr_ = 0;
  uint64_t size_ = 0;
  CUmemGenericAllocationHandle handle_ = 0;
  std::string ipc_;
};

StatusOr<std::unique_ptr<Arena>> create_vmm(uint64_t bytes, int device) {
  const Driver& d = driver();
  auto a = std::make_unique<DeviceArena>();
  a->vmm_ = true;
  a->device_ = device;
  const CUmemAllocationProp prop = vmm_prop(device);
  size_t gran = 0;
  RETURN_IF_ERROR(cu(d.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity"));
  a->size_ = (bytes + gran - 1) / gran * gran;
  RETURN_IF_ERROR(cu(d.create(&a->handle_, a->size_, &prop, 0), "cuMemCreate"));
  auto ptr = map_handle(a->handle_, a->size_, gran, device, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  if (!ptr.ok()) {
    d.release(a->handle_);
    a->vmm_ = false;  // nothing else to undo
    return ptr.status();
  }
  a->ptr_ = *ptr;
  int fd = -1;
  RETURN_IF_ERROR(cu(d.export_handle(&fd, a->handle_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                     "cuMemExportToShareableHandle"));
  a->fd_ = fd;
  return std::unique_ptr<Arena>(std::move(a));
}

StatusOr<std::unique_ptr<Arena>> create_ipc(uint64_t bytes, int device) {
  auto a = std::make_unique<DeviceArena>();
  a->device_ = device;
  a->size_ = bytes;
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) return cuda_error(e, absl::StrCat("cudaMalloc of ", bytes, " bytes").c_str());
  a->ptr_ = reinterpret_cast<CUdeviceptr>(p);
  cudaIpcMemHandle_t h;
  e = cudaIpcGetMemHandle(&h, p);
  if (e != cudaSuccess) return cuda_error(e, "cudaIpcGetMemHandle");
  a->ipc_.assign(reinterpret_cast<const char*>(&h), sizeof(h));
  return std::unique_ptr<Arena>(std::move(a));
}

}  // namespace

StatusOr<std::unique_ptr<Arena>> create_device_arena(uint64_t bytes, int device, const std::string& mechanism,
                                                     std::string* report) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || device >= n) {
    return absl::UnavailableError(absl::StrCat("no CUDA device ", device, " (", n, " present)"));
  }
  if (const cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return cuda_error(e, "cudaSetDevice");
  cudaFree(nullptr);  // creates the primary context (initialises the driver)
  if (mechanism != "auto" && mechanism != "cuda-vmm-fd" && mechanism != "cuda-ipc") {
    return absl::InvalidArgumentError(absl::StrCat("unknown device arena mechanism '", mechanism, "'"));
  }
  std::string why;
  if (mechanism != "cuda-ipc") {
    const Driver& d = driver();
    int vmm = 0, posix = 0;
    Status probe = d.status;
    if (probe.ok()) probe = cu(d.device_attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device), "attribute");
    if (probe.ok()) {
      probe = cu(d.device_attribute(&posix, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, device), "attribute");
    }
    if (probe.ok() && vmm && posix) {
      auto a = create_vmm(bytes, device);
      if (a.ok()) {
        *report = absl::StrCat("device arena: VMM with POSIX-fd handles on device ", device, " (", (*a)->bytes(), " bytes)");
        return a;
      }
      probe = a.status();
    } else if (probe.ok()) {
      probe = absl::UnavailableError(absl::StrCat("device reports VMM ", vmm, ", POSIX-fd handles ", posix));
    }
    if (mechanism == "cuda-vmm-fd") return probe;
    why = std::string(probe.message());
  }
  auto a = create_ipc(bytes, device);
  if (a.ok()) {
    *report = absl::StrCat("device arena: legacy CUDA IPC handle on device ", device, " (", (*a)->bytes(), " bytes)",
                           why.empty() ? "" : absl::StrCat("; VMM fd unavailable: ", why));
  }
  return a;
}

StatusOr<std::unique_ptr<DeviceArenaMapping>> DeviceArenaMapping::import(const std::string& mechanism, int fd,
                                                                         const std::string& handle, uint64_t bytes,
                                                                         int device) {
  std::unique_ptr<DeviceArenaMapping> m(new DeviceArenaMapping());
  m->bytes_ = bytes;
  if (const cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    if (fd >= 0) ::close(fd);
    return cuda_error(e, "cudaSetDevice");
  }
  cudaFree(nullptr);
  if (mechanism == "cuda-ipc") {
    if (handle.size() != sizeof(cudaIpcMemHandle_t)) return absl::InvalidArgumentError("malformed CUDA IPC handle");
    cudaIpcMemHandle_t h;
    std::memcpy(&h, handle.data(), sizeof(h));
    void* p = nullptr;
    const cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) return cuda_error(e, "cudaIpcOpenMemHandle");
    m->data_ = static_cast<uint8_t*>(p);
    m->ipc_ = true;
    return m;
  }
  if (mechanism != "cuda-vmm-fd") {
    if (fd >= 0) ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("not a device arena mechanism: '", mechanism, "'"));
  }
  const Driver& d = driver();
  RETURN_IF_ERROR(d.status);
  CUmemGenericAllocationHandle h = 0;
  const Status s = cu(d.import_handle(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                      "cuMemImportFromShareableHandle");
  ::close(fd);
  RETURN_IF_ERROR(s);
  const CUmemAllocationProp prop = vmm_prop(device);
  size_t gran = 0;
  RETURN_IF_ERROR(cu(d.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity"));
  m->mapped_ = (bytes + gran - 1) / gran * gran;
  m->handle_ = h;
  auto ptr = map_handle(h, m->mapped_, gran, device, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  if (!ptr.ok()) {
    d.release(h);
    m->handle_ = 0;
    return ptr.status();
  }
  m->data_ = reinterpret_cast<uint8_t*>(*ptr);
  return m;
}

DeviceArenaMapping::~DeviceArenaMapping() {
  if (data_ == nullptr) return;
  if (ipc_) {
    cudaIpcCloseMemHandle(data_);
    return;
  }
  const Driver& d = driver();
  d.unmap(reinterpret_cast<CUdeviceptr>(data_), mapped_);
  d.address_free(reinterpret_cast<CUdeviceptr>(data_), mapped_);
  d.release(handle_);
}

}  // namespace dsflash::expertstore
