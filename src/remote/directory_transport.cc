// DirectoryTransport (directory_transport.h): one file per key on a shared mount.
#include "kvtier/directory_transport.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "internal/deadline_timer.h"
#include "internal/mutex.h"
#include "remote/transport_items.h"

namespace kvtier {
namespace {

absl::Status FromErrno(int err, const std::string& what) {
  const std::string message = absl::StrCat(what, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(message);
  if (err == ENOSPC || err == EDQUOT || err == EFBIG) return absl::ResourceExhaustedError(message);
  return absl::UnavailableError(message);
}

// The file name for `key`, or an error for a key that could name anything but one file.
absl::StatusOr<std::string> FileName(const std::string& key) {
  if (key.empty() || key.size() > 200) {
    return absl::InvalidArgumentError(
        absl::StrCat("directory: a key of ", key.size(), " bytes (1 to 200)"));
  }
  std::string name = key;
  for (char& c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-' || c == ':';
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("directory: key \"", key, "\" has a character outside [A-Za-z0-9._:-]"));
    }
  }
  if (name == "." || name == ".." || name.starts_with(".tmp")) {
    return absl::InvalidArgumentError(absl::StrCat("directory: key \"", key, "\" is reserved"));
  }
  return name;
}

// Writes all of `data` to `fd`.
bool WriteAll(int fd, const std::byte* data, size_t n) {
  while (n > 0) {
    const ssize_t w = write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w == 0) errno = EIO;  // no progress and no error: call it an I/O error
    if (w <= 0) return false;
    data += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Removes temporary files (".tmp.*") older than `age`: left by a writer that crashed between
// creating and renaming one. A live writer's temporary file is seconds old. Best effort: an
// entry that vanishes meanwhile (another process swept it) is fine.
void SweepStaleTemporaries(const std::string& root, absl::Duration age) {
  if (age <= absl::ZeroDuration()) return;
  std::error_code ec;
  const auto cutoff = std::filesystem::file_time_type::clock::now() -
                      std::chrono::duration_cast<std::filesystem::file_time_type::duration>(
                          absl::ToChronoSeconds(age));
  for (std::filesystem::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->path().filename().string().starts_with(".tmp.")) continue;
    std::error_code entry_ec;
    if (!it->is_regular_file(entry_ec) || entry_ec) continue;
    const auto written = it->last_write_time(entry_ec);
    if (!entry_ec && written < cutoff) std::filesystem::remove(it->path(), entry_ec);
  }
}

// The values in `root` (regular files that are not temporaries): path, size, modification time.
struct StoredValue {
  std::filesystem::path path;
  int64_t bytes = 0;
  std::filesystem::file_time_type written;
};
std::vector<StoredValue> ListValues(const std::string& root) {
  std::vector<StoredValue> out;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().filename().string().starts_with(".tmp")) continue;
    std::error_code entry_ec;
    if (!it->is_regular_file(entry_ec) || entry_ec) continue;
    const auto size = it->file_size(entry_ec);
    if (entry_ec) continue;
    const auto written = it->last_write_time(entry_ec);
    if (entry_ec) continue;
    out.push_back({it->path(), static_cast<int64_t>(size), written});
  }
  return out;
}

}  // namespace

// One item's answer. Whoever claims it first completes it: the deadline timer, or the worker
// once the item's I/O is done (a Get claims it before it copies the value into the caller's
// buffers, so nothing is written there after the deadline fired).
struct DirectoryTransport::Answer {
  Completion done;
  absl::Time deadline = absl::InfiniteFuture();
  uint64_t timer_id = 0;  // set before the item is queued
  std::atomic<bool> claimed{false};
  bool Claim() { return !claimed.exchange(true); }
};

// The worker threads and the items waiting for one, in two lanes: values (Put, Get) and
// names (Exists, Delete: one system call each). A discovery probe (Exists) has a deadline of
// milliseconds, and a remote tier's write may wait for a Delete: neither waits behind writes of
// megabytes. One thread serves names alone; the others serve values, then names.
struct DirectoryTransport::Pool {
  // Waiting items past which a call fails at once (kUnavailable) instead of queueing behind a
  // mount that stopped answering (and DirectoryTransportOptions::max_queued_bytes).
  static constexpr size_t kMaxQueued = 4096;
  struct Task {
    std::function<void(bool run)> fn;  // runs the item (true) or fails it as cancelled (false)
    int64_t bytes = 0;                 // of its copied value
  };
  internal::Mutex mu;
  internal::CondVar cv;
  std::deque<Task> values ABSL_GUARDED_BY(mu);
  std::deque<Task> names ABSL_GUARDED_BY(mu);
  int64_t queued_bytes ABSL_GUARDED_BY(mu) = 0;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  internal::DeadlineTimer timer;
  std::vector<std::thread> threads;
};

DirectoryTransport::DirectoryTransport(const DirectoryTransportOptions& options, uint64_t nonce)
    : options_(options), nonce_(nonce) {}

void DirectoryTransport::RunWorker(bool names_only) {
  while (true) {
    Pool::Task task;
    {
      internal::MutexLock lock(&pool_->mu);
      while (pool_->names.empty() && (names_only || pool_->values.empty()) && !pool_->stopping) {
        pool_->cv.Wait(&pool_->mu);
      }
      std::deque<Pool::Task>* lane = nullptr;
      if (!names_only && !pool_->values.empty()) {
        lane = &pool_->values;
      } else if (!pool_->names.empty()) {
        lane = &pool_->names;
      } else {
        return;  // stopping, and nothing of this thread's lanes is left
      }
      task = std::move(lane->front());
      lane->pop_front();
      pool_->queued_bytes -= task.bytes;
    }
    task.fn(true);
  }
}

DirectoryTransport::~DirectoryTransport() {
  if (pool_ == nullptr) return;
  std::deque<Pool::Task> left;
  {
    internal::MutexLock lock(&pool_->mu);
    pool_->stopping = true;
    left.swap(pool_->values);
    for (Pool::Task& t : pool_->names) left.push_back(std::move(t));
    pool_->names.clear();
    pool_->queued_bytes = 0;
    pool_->cv.SignalAll();
  }
  for (Pool::Task& task : left) task.fn(false);
  // Items running finish first (a hung mount holds this, as it holds the worker).
  for (std::thread& t : pool_->threads) t.join();
}

Completion DirectoryTransport::Submit(absl::Time deadline, bool names_lane, int64_t bytes,
                                      std::function<void(Answer& answer)> work) {
  auto answer = std::make_shared<Answer>();
  answer->deadline = deadline;
  // One critical section: a call from a completion callback of the destructor's cancellations
  // sees `stopping`, and timer_id is set before any worker can see the item.
  internal::MutexLock lock(&pool_->mu);
  if (pool_->stopping) {
    return Completion::Done(absl::CancelledError("directory: the transport is being destroyed"));
  }
  const size_t waiting = pool_->values.size() + pool_->names.size();
  // A value past the bound on its own waits behind nothing when nothing waits: taken then, or
  // it could never be stored.
  if (waiting >= Pool::kMaxQueued ||
      (pool_->queued_bytes > 0 && pool_->queued_bytes + bytes > options_.max_queued_bytes)) {
    return Completion::Done(absl::UnavailableError(absl::StrCat(
        "directory: ", waiting, " items of ", pool_->queued_bytes, " bytes (max_queued_bytes ",
        options_.max_queued_bytes, ") wait for a worker on ", options_.root,
        ": the mount is slow or not answering")));
  }
  if (deadline != absl::InfiniteFuture()) {
    // The timer's callback never takes pool_->mu, so scheduling under it cannot deadlock.
    answer->timer_id = pool_->timer.Schedule(deadline, [answer] {
      if (answer->Claim()) {
        answer->done.Complete(absl::DeadlineExceededError("directory: no answer by the deadline"));
      }
    });
  }
  Completion out = answer->done;
  (names_lane ? pool_->names : pool_->values)
      .push_back({[this, answer, work = std::move(work)](bool run) {
                    if (!run) {
                      Finish(*answer,
                             absl::CancelledError("directory: the transport is being destroyed"));
                    } else if (!answer->claimed.load()) {  // else its deadline answered it
                      work(*answer);
                    }
                  },
                  bytes});
  pool_->queued_bytes += bytes;
  pool_->cv.SignalAll();  // a names-only thread may not take a value
  return out;
}

bool DirectoryTransport::Take(Answer& answer) {
  if (!answer.Claim()) return false;
  if (answer.timer_id != 0) pool_->timer.Cancel(answer.deadline, answer.timer_id);
  return true;
}

void DirectoryTransport::Finish(Answer& answer, absl::Status status) {
  if (Take(answer)) answer.done.Complete(std::move(status));
}

void DirectoryTransport::Account(int64_t bytes) {
  if (options_.max_bytes <= 0) return;
  if (counted_bytes_.fetch_add(bytes) + bytes <= options_.max_bytes) return;
  if (sweeping_.exchange(true)) return;  // another thread of this transport is sweeping
  Sweep();
  sweeping_.store(false);
}

void DirectoryTransport::Sweep() {
  std::vector<StoredValue> values = ListValues(options_.root);
  int64_t total = 0;
  for (const StoredValue& v : values) total += v.bytes;
  const auto target =
      static_cast<int64_t>(static_cast<double>(options_.max_bytes) * options_.sweep_to_fraction);
  if (total > target) {
    std::sort(values.begin(), values.end(),
              [](const StoredValue& a, const StoredValue& b) { return a.written < b.written; });
    for (const StoredValue& v : values) {
      if (total <= target) break;
      std::error_code ec;
      // Gone already (another process swept or deleted it) is as good as removed here.
      if (std::filesystem::remove(v.path, ec) || !ec) {
        total -= v.bytes;
        if (!ec) {  // bytes first: a reader that sees the value counted sees its bytes
          swept_bytes_.fetch_add(v.bytes);
          swept_values_.fetch_add(1);
        }
      }
    }
  }
  counted_bytes_.store(total);
}

absl::StatusOr<std::unique_ptr<DirectoryTransport>> DirectoryTransport::Create(
    const DirectoryTransportOptions& options) {
  if (options.root.empty()) return absl::InvalidArgumentError("directory: the root is empty");
  if (options.max_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("directory: max_bytes = ", options.max_bytes, " (0 for no bound, or > 0)"));
  }
  if (!(options.sweep_to_fraction > 0 && options.sweep_to_fraction <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("directory: sweep_to_fraction = ", options.sweep_to_fraction, " (in (0, 1])"));
  }
  if (options.io_threads < 1 || options.io_threads > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("directory: io_threads = ", options.io_threads, " (1 to 64)"));
  }
  if (options.max_queued_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("directory: max_queued_bytes = ", options.max_queued_bytes, " (> 0)"));
  }
  std::error_code ec;
  if (std::filesystem::create_directories(options.root, ec)) {
    // A root we made is ours alone: KV reveals prompts.
    std::filesystem::permissions(options.root, std::filesystem::perms::owner_all, ec);
  }
  if (ec || !std::filesystem::is_directory(options.root)) {
    return absl::UnavailableError(absl::StrCat("directory: cannot use ", options.root, ": ",
                                               ec ? ec.message() : "not a directory"));
  }
  uint64_t nonce = 0;
  if (getrandom(&nonce, sizeof(nonce), 0) != static_cast<ssize_t>(sizeof(nonce))) {
    return FromErrno(errno, "directory: getrandom");
  }
  SweepStaleTemporaries(options.root, options.stale_temporary_age);
  auto transport = std::unique_ptr<DirectoryTransport>(new DirectoryTransport(options, nonce));
  if (options.max_bytes > 0) {
    int64_t total = 0;
    for (const StoredValue& v : ListValues(options.root)) total += v.bytes;
    transport->counted_bytes_.store(total);
  }
  transport->pool_ = std::make_unique<Pool>();
  transport->pool_->threads.emplace_back([t = transport.get()] { t->RunWorker(true); });
  for (int i = 0; i < options.io_threads; ++i) {
    transport->pool_->threads.emplace_back([t = transport.get()] { t->RunWorker(false); });
  }
  return transport;
}

std::string DirectoryTransport::name() const {
  return absl::StrCat("directory(", options_.root, ")");
}

absl::Status DirectoryTransport::PutValue(const std::string& name,
                                          absl::Span<const std::byte> value, bool if_absent) {
  const std::string path = options_.root + "/" + name;
  // What is at the key without following it: only a regular file is a stored value. Anything
  // else (a symbolic link, a FIFO: planted, or left by a tool) is removed so that the value
  // can be written; rename would replace a link, but link(2) of if_absent fails on one.
  struct stat at {};
  const bool exists = lstat(path.c_str(), &at) == 0;
  if (exists && !S_ISREG(at.st_mode)) {
    if (unlink(path.c_str()) != 0 && errno != ENOENT) {  // a directory, say
      return absl::DataLossError(
          absl::StrCat("directory: ", path, " is not a value and cannot be replaced"));
    }
  } else if (if_absent && exists) {  // stored already: skip the write
    return absl::AlreadyExistsError("directory: " + path + " exists");
  }
  // Unique across hosts sharing the mount and transports (a random nonce per transport; pids
  // and addresses repeat between hosts) and calls (counter). O_EXCL catches the impossible.
  const std::string tmp = absl::StrCat(options_.root, "/.tmp.", absl::Hex(nonce_, absl::kZeroPad16),
                                       ".", next_tmp_.fetch_add(1), ".", name);
  // 0600: KV reveals the prompts it came from, and frames are not encrypted.
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int e = errno;
    return FromErrno(e, "directory: creating " + tmp);
  }
  bool ok = WriteAll(fd, value.data(), value.size());
  int err = ok ? 0 : errno;
  if (ok && options_.fsync != FsyncPolicy::kNone && fsync(fd) != 0) {
    ok = false;
    err = errno;
  }
  // A delayed write error (NFS: ENOSPC, EDQUOT, EIO) may only show here.
  if (close(fd) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (ok && if_absent) {
    // link(2) never replaces: it fails with EEXIST if the name exists. A file system without
    // hard links gets the rename (the check above made a second writer unlikely; a value
    // replaced by an equal one is harmless for content-addressed blocks).
    if (link(tmp.c_str(), path.c_str()) == 0) {
      unlink(tmp.c_str());
    } else if (errno == EPERM || errno == ENOTSUP || errno == ENOSYS) {
      if (rename(tmp.c_str(), path.c_str()) != 0) {
        ok = false;
        err = errno;
      }
    } else {
      err = errno;
      unlink(tmp.c_str());
      // EEXIST: another writer's file got there first.
      if (err == EEXIST) return absl::AlreadyExistsError("directory: " + path + " exists");
      ok = false;
    }
  } else if (ok && rename(tmp.c_str(), path.c_str()) != 0) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    unlink(tmp.c_str());
    return FromErrno(err == 0 ? EIO : err, "directory: writing " + path);
  }
  if (options_.fsync == FsyncPolicy::kFileAndDirectory) {
    const int dir = open(options_.root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    const bool synced = dir >= 0 && fsync(dir) == 0;
    const int e = errno;
    if (dir >= 0) close(dir);
    if (!synced) return FromErrno(e, "directory: fsync of " + options_.root);
  }
  return absl::OkStatus();
}

std::vector<Completion> DirectoryTransport::Put(absl::Span<const TransportPut> items,
                                                absl::Time deadline) {
  std::vector<Completion> out;
  out.reserve(items.size());
  for (const TransportPut& p : items) {
    absl::StatusOr<std::string> name = FileName(p.key);
    if (!name.ok()) {
      out.push_back(Completion::Done(name.status()));
      continue;
    }
    if (absl::Now() > deadline) {
      out.push_back(Completion::Done(absl::DeadlineExceededError("directory: deadline passed")));
      continue;
    }
    // The value is copied now: the item may complete at its deadline while a worker is still
    // writing (a hung mount), and the caller's buffer is the caller's again from then.
    std::vector<std::byte> value;
    value.reserve(p.value_prefix.size() + p.value.size());
    value.insert(value.end(), p.value_prefix.begin(), p.value_prefix.end());
    value.insert(value.end(), p.value.begin(), p.value.end());
    const auto bytes = static_cast<int64_t>(value.size());
    out.push_back(Submit(deadline, /*names_lane=*/false, bytes,
                         [this, name = *std::move(name), value = std::move(value),
                          if_absent = p.if_absent](Answer& answer) {
                           const absl::Status put = PutValue(name, value, if_absent);
                           Finish(answer, put);
                           // After the answer: a sweep may list a large root.
                           if (put.ok()) Account(static_cast<int64_t>(value.size()));
                         }));
  }
  return out;
}

absl::Status DirectoryTransport::ReadValue(const std::string& name, int64_t max_bytes,
                                           std::vector<std::byte>* out) {
  const std::string path = options_.root + "/" + name;
  // Only a regular file of a sane size is a value: no symlinks (O_NOFOLLOW), no FIFOs or
  // devices (O_NONBLOCK keeps a FIFO from blocking the open), nothing larger than the reader
  // can use.
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    const int e = errno;
    // A symbolic link at a key is a damaged value (kDataLoss: a miss the tier counts and
    // replaces), not a store that is down.
    return e == ELOOP ? absl::DataLossError(
                            absl::StrCat("directory: ", path, " is a symbolic link, not a value"))
                      : FromErrno(e, "directory: " + path);
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (max_bytes > 0 && st.st_size > max_bytes)) {
    close(fd);
    return absl::DataLossError(absl::StrCat(
        "directory: ", path, " is not a regular file of at most ", max_bytes, " bytes"));
  }
  out->resize(static_cast<size_t>(st.st_size));
  size_t done = 0;
  bool ok = true;
  while (done < out->size()) {
    const ssize_t r = read(fd, out->data() + done, out->size() - done);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      ok = false;
      break;
    }
    done += static_cast<size_t>(r);
  }
  // A read makes the value recently used for the sweep (max_bytes): oldest-written is
  // least-recently-used once reads refresh the time. Best effort (a read-only mount).
  if (ok && options_.max_bytes > 0) (void)futimens(fd, nullptr);
  close(fd);
  if (!ok) return absl::UnavailableError("directory: short read of " + path);
  return absl::OkStatus();
}

std::vector<Completion> DirectoryTransport::Get(absl::Span<const TransportGet> items,
                                                absl::Time deadline) {
  std::vector<Completion> out;
  out.reserve(items.size());
  for (const TransportGet& g : items) {
    absl::StatusOr<std::string> name = FileName(g.key);
    if (!name.ok()) {
      out.push_back(Completion::Done(name.status()));
      continue;
    }
    if (absl::Status s = internal::CheckGetItem(g, "directory"); !s.ok()) {
      out.push_back(Completion::Done(std::move(s)));
      continue;
    }
    if (absl::Now() > deadline) {
      out.push_back(Completion::Done(absl::DeadlineExceededError("directory: deadline passed")));
      continue;
    }
    out.push_back(Submit(
        deadline, /*names_lane=*/false, 0, [this, name = *std::move(name), g](Answer& answer) {
          // Read into a buffer of the worker's; the caller's buffers are written only once the
          // item is claimed, so never after its deadline answered it.
          std::vector<std::byte> bytes;
          const absl::Status read = ReadValue(name, g.max_bytes, &bytes);
          if (!Take(answer)) return;
          answer.done.Complete(read.ok() ? internal::DeliverValue(g, bytes, "directory") : read);
        }));
  }
  return out;
}

std::vector<Completion> DirectoryTransport::ForEachKey(absl::Span<const std::string> keys,
                                                       absl::Time deadline,
                                                       bool (*op)(const std::string& path)) {
  std::vector<Completion> out;
  out.reserve(keys.size());
  for (const std::string& k : keys) {
    absl::StatusOr<std::string> name = FileName(k);
    if (!name.ok()) {
      out.push_back(Completion::Done(name.status()));
    } else if (absl::Now() > deadline) {
      out.push_back(Completion::Done(absl::DeadlineExceededError("directory: deadline passed")));
    } else {
      out.push_back(Submit(deadline, /*names_lane=*/true, 0,
                           [this, path = options_.root + "/" + *name, k, op](Answer& answer) {
                             const bool ok = op(path);
                             const int e = errno;
                             Finish(answer,
                                    ok ? absl::OkStatus() : FromErrno(e, "directory: " + k));
                           }));
    }
  }
  return out;
}

std::vector<Completion> DirectoryTransport::Exists(absl::Span<const std::string> keys,
                                                   absl::Time deadline) {
  // Only a regular file is a value (what Get reads); a symbolic link is not followed.
  return ForEachKey(keys, deadline, [](const std::string& path) {
    struct stat st {};
    if (lstat(path.c_str(), &st) != 0) return false;
    if (S_ISREG(st.st_mode)) return true;
    errno = ENOENT;
    return false;
  });
}

std::vector<Completion> DirectoryTransport::Delete(absl::Span<const std::string> keys,
                                                   absl::Time deadline) {
  return ForEachKey(keys, deadline,
                    [](const std::string& path) { return unlink(path.c_str()) == 0; });
}

}  // namespace kvtier
