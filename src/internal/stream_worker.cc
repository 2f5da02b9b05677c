// StreamWorker (stream_worker.h): a thread running queued tasks in order, like a CUDA stream.
#include "internal/stream_worker.h"

#include <utility>

namespace kvtier::internal {

StreamWorker::StreamWorker() : thread_([this] { Run(); }) {}

StreamWorker::~StreamWorker() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    cv_.SignalAll();
  }
  thread_.join();
}

void StreamWorker::Enqueue(std::function<void()> task) {
  MutexLock lock(&mu_);
  queue_.push_back(std::move(task));
  cv_.Signal();
}

void StreamWorker::Run() {
  while (true) {
    std::function<void()> task;
    {
      MutexLock lock(&mu_);
      while (queue_.empty() && !stopping_) cv_.Wait(&mu_);
      if (queue_.empty()) return;  // stopping, and everything queued has run
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace kvtier::internal
