// A thread that runs queued tasks one at a time, in order: the host stand-in for a CUDA stream.
// Work is queued by any thread; tasks run on the worker. The destructor runs every task already
// queued, then joins.
#ifndef KVTIER_INTERNAL_STREAM_WORKER_H_
#define KVTIER_INTERNAL_STREAM_WORKER_H_

#include <deque>
#include <functional>
#include <string>
#include <thread>

#include "internal/mutex.h"

namespace kvtier::internal {

class StreamWorker {
 public:
  StreamWorker();
  ~StreamWorker();
  StreamWorker(const StreamWorker&) = delete;
  StreamWorker& operator=(const StreamWorker&) = delete;

  void Enqueue(std::function<void()> task);

 private:
  void Run();

  Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts after the members it uses exist
};

}  // namespace kvtier::internal

#endif  // KVTIER_INTERNAL_STREAM_WORKER_H_
