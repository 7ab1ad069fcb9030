#include "gpu_clock.h"

#include <dlfcn.h>

#include <chrono>

namespace k3moe::cli {
namespace {

constexpr int kNvmlSuccess = 0;
constexpr int kNvmlClockSm = 1;   // nvmlClockType_t NVML_CLOCK_SM
constexpr int kNvmlClockMem = 2;  // NVML_CLOCK_MEM

template <class F>
F symbol(void* library, const char* name) {
  return reinterpret_cast<F>(dlsym(library, name));
}

}  // namespace

ClockSampler::ClockSampler(const std::string& pci_bus_id, int period_us) : period_us_(period_us) {
  library_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library_ == nullptr) {
    why_ = "NVML (libnvidia-ml.so.1) not found";
    return;
  }
  const auto init = symbol<int (*)()>(library_, "nvmlInit_v2");
  const auto by_bus_id = symbol<int (*)(const char*, void**)>(library_, "nvmlDeviceGetHandleByPciBusId_v2");
  clock_info_ = symbol<int (*)(void*, int, unsigned*)>(library_, "nvmlDeviceGetClockInfo");
  shutdown_ = symbol<int (*)()>(library_, "nvmlShutdown");
  // Renamed in CUDA 12.2's NVML; the older name stays exported.
  event_reasons_ = symbol<int (*)(void*, unsigned long long*)>(library_, "nvmlDeviceGetCurrentClocksEventReasons");
  if (event_reasons_ == nullptr)
    event_reasons_ =
        symbol<int (*)(void*, unsigned long long*)>(library_, "nvmlDeviceGetCurrentClocksThrottleReasons");
  if (!init || !by_bus_id || !clock_info_ || !shutdown_ || !event_reasons_) {
    why_ = "NVML lacks the clock functions";
    shutdown_ = nullptr;
    return;
  }
  if (const int status = init(); status != kNvmlSuccess) {
    why_ = "nvmlInit failed (" + std::to_string(status) + ")";
    shutdown_ = nullptr;
    return;
  }
  if (const auto driver_version = symbol<int (*)(char*, unsigned)>(library_, "nvmlSystemGetDriverVersion")) {
    char release[96] = {};
    if (driver_version(release, sizeof release - 1) == kNvmlSuccess) driver_release_ = release;
  }
  void* device = nullptr;
  if (const int status = by_bus_id(pci_bus_id.c_str(), &device); status != kNvmlSuccess) {
    why_ = "NVML has no GPU at PCI bus id '" + pci_bus_id + "' (" + std::to_string(status) + ")";
    return;
  }
  ClockSample probe;
  device_ = device;
  if (!read(probe)) {
    device_ = nullptr;
    why_ = "NVML does not report this GPU's SM clock";
  }
}

ClockSampler::~ClockSampler() {
  if (running_) stop();
  if (shutdown_ != nullptr) shutdown_();
  if (library_ != nullptr) dlclose(library_);
}

bool ClockSampler::read(ClockSample& sample) const {
  unsigned long long reasons = 0;
  if (clock_info_(device_, kNvmlClockSm, &sample.mhz) != kNvmlSuccess) return false;
  if (event_reasons_(device_, &reasons) == kNvmlSuccess) sample.reasons = reasons;
  if (clock_info_(device_, kNvmlClockMem, &sample.mem_mhz) != kNvmlSuccess) sample.mem_mhz = 0;
  return true;
}

void ClockSampler::start() {
  if (!available() || running_) return;
  samples_.clear();
  origin_ = std::chrono::steady_clock::now();
  running_ = true;
  thread_ = std::thread([this] {
    for (auto next = std::chrono::steady_clock::now(); running_; std::this_thread::sleep_until(next)) {
      next += std::chrono::microseconds(period_us_);
      ClockSample sample;
      if (!read(sample)) continue;
      sample.t_ms = elapsed_ms();
      samples_.push_back(sample);
    }
  });
}

double ClockSampler::elapsed_ms() const {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - origin_).count();
}

ClockSummary ClockSampler::stop() {
  if (!running_) return {};
  running_ = false;
  thread_.join();
  return summarize_clock(samples_);
}

}  // namespace k3moe::cli
