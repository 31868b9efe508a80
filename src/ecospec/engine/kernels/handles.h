// The native steps' prepared objects by handle (qwen3_step.cpp, eagle3_step.cpp, predictor_step.cpp): an op's setup
// keeps what a step reads (weights, caches) and returns an integer handle, each step call names it, and the Python
// object that made it frees it when it goes.
#pragma once

#include <c10/util/Exception.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace ecospec {

template <typename T>
class Handles {
 public:
  explicit Handles(const char* what) : what_(what) {}

  int64_t add(std::unique_ptr<T> item) {
    std::lock_guard<std::mutex> hold(lock_);
    items_.push_back(std::move(item));
    return static_cast<int64_t>(items_.size()) - 1;
  }

  T& get(int64_t handle) {
    std::lock_guard<std::mutex> hold(lock_);
    TORCH_CHECK(handle >= 0 && handle < static_cast<int64_t>(items_.size()) && items_[handle], what_,
                ": nothing prepared under handle ", handle);
    return *items_[handle];
  }

  void drop(int64_t handle) {
    std::lock_guard<std::mutex> hold(lock_);
    if (handle >= 0 && handle < static_cast<int64_t>(items_.size())) items_[handle].reset();
  }

 private:
  const char* what_;
  std::mutex lock_;
  std::vector<std::unique_ptr<T>> items_;
};

}  // namespace ecospec
