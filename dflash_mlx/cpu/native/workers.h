// Helper threads that split one kernel's work with the calling thread (an MLX
// CPU stream's). Between the kernels of a forward they spin briefly, then sleep.
#pragma once

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dflash {

constexpr int MAX_THREADS = 8;  // a few cores already saturate memory bandwidth

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

class Workers {
 public:
  static Workers& get() {
    static Workers* workers = new Workers();  // never destroyed: threads detach
    return *workers;
  }

  int threads() const { return (int)helpers_.size() + 1; }

  // job(part) for part in [0, parts); the caller runs part 0. A second caller
  // while a job runs (another stream's thread) runs all its parts itself.
  void run(int parts, const std::function<void(int)>& job) {
    std::unique_lock<std::mutex> lock(busy_, std::try_to_lock);
    if (!lock.owns_lock() || parts <= 1 || helpers_.empty()) {
      for (int p = 0; p < parts; p++) job(p);
      return;
    }
    job_ = &job;
    parts_ = std::min(parts, threads());
    pending_.store((int)helpers_.size(), std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    job(0);
    for (int p = parts_; p < parts; p++) job(p);
    while (pending_.load(std::memory_order_acquire) != 0) cpu_relax();
  }

  // job(first, last) over [0, n) in `threads()` contiguous ranges, their bounds
  // multiples of `align`; one range when `parallel` is false.
  void split(int n, int align, bool parallel,
             const std::function<void(int, int)>& job) {
    int parts = parallel ? threads() : 1;
    int per = (n + parts - 1) / parts;
    per = (per + align - 1) / align * align;
    run(parts, [&](int part) {
      int first = part * per, last = std::min(n, first + per);
      if (first < last) job(first, last);
    });
  }

 private:
  Workers() {
    int n = std::min(usable_cpus(), MAX_THREADS);
    for (int i = 1; i < n; i++) {
      helpers_.emplace_back([this, i] { loop(i); });
      helpers_.back().detach();
    }
  }

  static int usable_cpus() {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
    return std::max(1u, std::thread::hardware_concurrency());
  }

  void loop(int part) {
    unsigned seen = 0;
    while (true) {
      for (int spin = 0; spin < 4000; spin++) {
        if (generation_.load(std::memory_order_acquire) != seen) break;
        cpu_relax();
      }
      generation_.wait(seen, std::memory_order_acquire);
      seen = generation_.load(std::memory_order_acquire);
      if (part < parts_) (*job_)(part);
      pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

  std::vector<std::thread> helpers_;
  std::mutex busy_;
  std::atomic<unsigned> generation_{0};
  std::atomic<int> pending_{0};
  const std::function<void(int)>* job_ = nullptr;
  int parts_ = 1;
};

}  // namespace dflash
