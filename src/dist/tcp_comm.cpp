// The TCP communicator (CPU tensors): ranks launched without MPI (plain srun) meet through a file in
// the run directory, as the NCCL id does on GPU, and run every collective through rank 0 over TCP.
// A star is slow for large worlds but simple and deterministic: rank 0 reduces in rank order.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"
#include "dist/comm.h"

namespace fp8t {

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kHelloMagic = 0x66703874;  // "fp8t"

// Owns a socket descriptor.
class Socket {
 public:
  explicit Socket(int fd = -1) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Socket& operator=(Socket&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  int fd() const { return fd_; }

 private:
  int fd_;
};

struct Hello {
  uint32_t magic;
  int32_t rank, world;
  uint64_t token;  // from the rendezvous file: a stray connection cannot join
};

// A collective's time limit; seconds <= 0 waits forever.
class Deadline {
 public:
  explicit Deadline(double seconds)
      : end_(seconds > 0 ? Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(seconds))
                         : Clock::time_point::max()) {}
  bool passed() const { return Clock::now() >= end_; }
  int poll_ms() const {  // how long one poll() may wait: at most 1 s, so a passed deadline is seen
    if (end_ == Clock::time_point::max()) return 1000;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end_ - Clock::now()).count();
    return static_cast<int>(std::clamp<int64_t>(left, 0, 1000));
  }

 private:
  Clock::time_point end_;
};

// What every failure message says first: which rank, in which operation, talking to whom.
struct Where {
  int rank, peer;
  const char* op;
  double timeout_s;
};

void wait_ready(int fd, short events, const Deadline& dl, const Where& w) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, dl.poll_ms());
    if (r > 0) return;
    if (r < 0 && errno != EINTR) FP8T_FAIL("rank {}: tcp {}: poll failed: {}", w.rank, w.op, std::strerror(errno));
    FP8T_CHECK(!dl.passed(), "rank {}: tcp {}{} did not complete within {} s (a peer rank probably died or stalls)",
               w.rank, w.op, w.peer >= 0 ? fmt::format(" with rank {}", w.peer) : "", w.timeout_s);
  }
}

void send_all(int fd, const void* data, size_t n, const Deadline& dl, const Where& w) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    wait_ready(fd, POLLOUT, dl, w);
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);  // a dead peer is an error, not SIGPIPE
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    FP8T_CHECK(k > 0, "rank {}: tcp {}: sending to rank {} failed: {} (the peer rank probably died)", w.rank, w.op,
               w.peer, std::strerror(errno));
    p += k;
    n -= static_cast<size_t>(k);
  }
}

void recv_all(int fd, void* data, size_t n, const Deadline& dl, const Where& w) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    wait_ready(fd, POLLIN, dl, w);
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    FP8T_CHECK(k != 0, "rank {}: tcp {}: rank {} closed the connection (it probably died)", w.rank, w.op, w.peer);
    FP8T_CHECK(k > 0, "rank {}: tcp {}: receiving from rank {} failed: {}", w.rank, w.op, w.peer,
               std::strerror(errno));
    p += k;
    n -= static_cast<size_t>(k);
  }
}

// acc[i] = op(acc[i], x[i]); bf16 is combined in f32 and rounded at every step, as MPI's and NCCL's are.
void combine(void* acc, const void* x, int64_t n, DType dtype, ReduceOp op) {
  if (dtype == DType::f32) {
    float* a = static_cast<float*>(acc);
    const float* b = static_cast<const float*>(x);
    for (int64_t i = 0; i < n; ++i) a[i] = op == ReduceOp::sum ? a[i] + b[i] : std::fmax(a[i], b[i]);
    return;
  }
  uint16_t* a = static_cast<uint16_t*>(acc);
  const uint16_t* b = static_cast<const uint16_t*>(x);
  for (int64_t i = 0; i < n; ++i) {
    const float fa = bf16_to_float(a[i]), fb = bf16_to_float(b[i]);
    a[i] = float_to_bf16(op == ReduceOp::sum ? fa + fb : std::fmax(fa, fb));
  }
}

bool overlaps(const void* a, size_t an, const void* b, size_t bn) {
  const char *pa = static_cast<const char*>(a), *pb = static_cast<const char*>(b);
  return pa < pb + bn && pb < pa + an;
}

void check_float_cpu(const Tensor& t, const char* what) {
  FP8T_CHECK((t.dtype() == DType::f32 || t.dtype() == DType::bf16) && t.device().is_cpu(),
             "tcp {}: needs an f32 or bf16 CPU tensor, got {}", what, t.str());
}

class TcpCommunicator final : public Communicator {
 public:
  TcpCommunicator(int rank, int world, const std::filesystem::path& rendezvous, double timeout_s)
      : rank_(rank), size_(world), timeout_s_(timeout_s) {
    FP8T_CHECK(world >= 1 && rank >= 0 && rank < world, "tcp: rank {} is outside a world of {}", rank, world);
    if (rank == 0) serve(rendezvous);
    else join(rendezvous);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "tcp"; }
  void set_timeout(double seconds) override { timeout_s_ = seconds; }

  void all_reduce(Tensor& t, ReduceOp op) override {
    check_float_cpu(t, "all_reduce");
    const Deadline dl(timeout_s_);
    if (rank_ == 0) {
      gather_reduce(t.raw(), t.numel(), t.dtype(), op, dl, "all_reduce");
      for (int p = 1; p < size_; ++p) send_all(peer(p), t.raw(), t.nbytes(), dl, where(p, "all_reduce"));
    } else {
      send_all(peer(0), t.raw(), t.nbytes(), dl, where(0, "all_reduce"));
      recv_all(peer(0), t.raw(), t.nbytes(), dl, where(0, "all_reduce"));
    }
  }

  void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) override {
    check_float_cpu(in, "reduce_scatter");
    FP8T_CHECK(in.dtype() == out.dtype() && in.numel() == out.numel() * size_,
               "tcp reduce_scatter: in {} must be {} ranks x out {}", in.str(), size_, out.str());
    const Deadline dl(timeout_s_);
    const size_t slice = out.nbytes();
    if (rank_ == 0) {
      // out may be in's own slice: reduce into a copy of in, then hand out the slices.
      std::vector<char> acc(static_cast<const char*>(in.raw()), static_cast<const char*>(in.raw()) + in.nbytes());
      gather_reduce(acc.data(), in.numel(), in.dtype(), op, dl, "reduce_scatter");
      for (int p = 1; p < size_; ++p) send_all(peer(p), acc.data() + p * slice, slice, dl, where(p, "reduce_scatter"));
      std::memcpy(out.raw(), acc.data(), slice);
    } else {
      send_all(peer(0), in.raw(), in.nbytes(), dl, where(0, "reduce_scatter"));
      recv_all(peer(0), out.raw(), slice, dl, where(0, "reduce_scatter"));
    }
  }

  void all_gather(const Tensor& in, Tensor& out) override {
    check_float_cpu(in, "all_gather");
    FP8T_CHECK(in.dtype() == out.dtype() && out.numel() == in.numel() * size_,
               "tcp all_gather: out {} must be {} ranks x in {}", out.str(), size_, in.str());
    const Deadline dl(timeout_s_);
    const size_t slice = in.nbytes();
    char* dst = static_cast<char*>(out.raw());
    FP8T_CHECK(in.raw() == dst + rank_ * slice || !overlaps(in.raw(), slice, dst, out.nbytes()),
               "tcp all_gather: in may be out's own rank slice or disjoint from out, not another overlap");
    if (rank_ == 0) {
      std::memmove(dst, in.raw(), slice);  // in may already be out's first slice
      for (int p = 1; p < size_; ++p) recv_all(peer(p), dst + p * slice, slice, dl, where(p, "all_gather"));
      for (int p = 1; p < size_; ++p) send_all(peer(p), dst, out.nbytes(), dl, where(p, "all_gather"));
    } else {
      send_all(peer(0), in.raw(), slice, dl, where(0, "all_gather"));  // before out (which in may alias) is written
      recv_all(peer(0), dst, out.nbytes(), dl, where(0, "all_gather"));
    }
  }

  void broadcast(Tensor& t, int root) override {
    FP8T_CHECK(t.device().is_cpu(), "tcp broadcast: needs a CPU tensor, got {}", t.str());
    FP8T_CHECK(root >= 0 && root < size_, "tcp broadcast: root {} is outside a world of {}", root, size_);
    const Deadline dl(timeout_s_);
    if (root != 0) {  // the root's bytes go to rank 0 first, which fans them out
      if (rank_ == root) send_all(peer(0), t.raw(), t.nbytes(), dl, where(0, "broadcast"));
      if (rank_ == 0) recv_all(peer(root), t.raw(), t.nbytes(), dl, where(root, "broadcast"));
    }
    if (rank_ == 0) {
      for (int p = 1; p < size_; ++p)
        if (p != root) send_all(peer(p), t.raw(), t.nbytes(), dl, where(p, "broadcast"));
    } else if (rank_ != root) {
      recv_all(peer(0), t.raw(), t.nbytes(), dl, where(0, "broadcast"));
    }
  }

  void barrier() override {
    const Deadline dl(timeout_s_);
    char byte = 0;
    if (rank_ == 0) {
      for (int p = 1; p < size_; ++p) recv_all(peer(p), &byte, 1, dl, where(p, "barrier"));
      for (int p = 1; p < size_; ++p) send_all(peer(p), &byte, 1, dl, where(p, "barrier"));
    } else {
      send_all(peer(0), &byte, 1, dl, where(0, "barrier"));
      recv_all(peer(0), &byte, 1, dl, where(0, "barrier"));
    }
  }

 private:
  Where where(int peer, const char* op) const { return {rank_, peer, op, timeout_s_}; }
  int peer(int p) const { return peers_[static_cast<size_t>(p)].fd(); }

  // Rank 0: acc = op over ranks, combining rank 1, 2, ... in order, a chunk at a time.
  void gather_reduce(void* acc, int64_t n, DType dtype, ReduceOp op, const Deadline& dl, const char* what) {
    const size_t esize = dtype_size(dtype);
    const int64_t chunk = std::min<int64_t>(n, (int64_t{1} << 20) / static_cast<int64_t>(esize));
    std::vector<char> buf(static_cast<size_t>(chunk) * esize);
    for (int p = 1; p < size_; ++p)
      for (int64_t i = 0; i < n; i += chunk) {
        const int64_t k = std::min(chunk, n - i);
        recv_all(peer(p), buf.data(), static_cast<size_t>(k) * esize, dl, where(p, what));
        combine(static_cast<char*>(acc) + i * static_cast<int64_t>(esize), buf.data(), k, dtype, op);
      }
  }

  // Rank 0: listen on an ephemeral port, publish "host port token" in the rendezvous file (atomically),
  // accept the other ranks, then remove the file.
  void serve(const std::filesystem::path& rendezvous) {
    peers_.resize(static_cast<size_t>(size_));
    if (size_ == 1) return;
    Socket listener(::socket(AF_INET, SOCK_STREAM, 0));
    FP8T_CHECK(listener.fd() >= 0, "tcp: socket() failed: {}", std::strerror(errno));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = 0;
    FP8T_CHECK(::bind(listener.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                   ::listen(listener.fd(), size_) == 0,
               "tcp: rank 0 cannot listen on a TCP port: {}", std::strerror(errno));
    socklen_t len = sizeof addr;
    ::getsockname(listener.fd(), reinterpret_cast<sockaddr*>(&addr), &len);
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    const uint64_t token = std::random_device{}() * 0x100000001ull ^ std::random_device{}();
    std::filesystem::create_directories(rendezvous.parent_path());
    const std::string tmp = rendezvous.string() + ".tmp";
    std::ofstream(tmp) << host << ' ' << ntohs(addr.sin_port) << ' ' << token << '\n';
    std::filesystem::rename(tmp, rendezvous);  // readers never see half a line

    const Deadline dl(timeout_s_);
    for (int joined = 1; joined < size_;) {
      wait_ready(listener.fd(), POLLIN, dl, {0, -1, "rendezvous (waiting for the other ranks)", timeout_s_});
      Socket s(::accept(listener.fd(), nullptr, nullptr));
      if (s.fd() < 0) continue;
      Hello h{};
      try {
        recv_all(s.fd(), &h, sizeof h, Deadline(5), {0, -1, "rendezvous", 5});
      } catch (const Error&) {
        continue;  // not one of ours
      }
      if (h.magic != kHelloMagic || h.token != token || h.world != size_ || h.rank <= 0 || h.rank >= size_ ||
          peer(h.rank) >= 0)
        continue;
      peers_[static_cast<size_t>(h.rank)] = std::move(s);
      ++joined;
    }
    for (int p = 1; p < size_; ++p) {
      const int one = 1;
      ::setsockopt(peer(p), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      char ok = 1;
      send_all(peer(p), &ok, 1, dl, where(p, "rendezvous"));
    }
    std::filesystem::remove(rendezvous);
  }

  // Ranks > 0: read rank 0's address from the rendezvous file and connect, retrying until the deadline
  // (the file may be missing, or left over from an earlier run whose rank 0 is gone).
  void join(const std::filesystem::path& rendezvous) {
    peers_.resize(1);
    const Deadline dl(timeout_s_);
    std::string last_error = "the file did not appear";
    for (;;) {
      FP8T_CHECK(!dl.passed(),
                 "rank {}: tcp rendezvous: could not reach rank 0 through {} within {} s ({}); run.out_dir must be "
                 "on a file system every node shares, and rank 0's host reachable over TCP",
                 rank_, rendezvous.string(), timeout_s_, last_error);
      std::string host;
      int port = 0;
      uint64_t token = 0;
      if (std::ifstream f(rendezvous); f >> host >> port >> token) {
        if (Socket s = connect_to(host, port, last_error); s.fd() >= 0) {
          const Hello h{kHelloMagic, rank_, size_, token};
          char ok = 0;
          try {
            send_all(s.fd(), &h, sizeof h, dl, where(0, "rendezvous"));
            recv_all(s.fd(), &ok, 1, dl, where(0, "rendezvous"));
          } catch (const Error& e) {
            if (dl.passed()) throw;
            last_error = e.what();  // a stale file's port, taken by something else: retry
          }
          if (ok == 1) {
            const int one = 1;
            ::setsockopt(s.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            peers_[0] = std::move(s);
            return;
          }
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  // A connected socket to host:port, or -1 with the reason in `error`. Rank 0 on this host is reached
  // over loopback, which works whatever the host name resolves to.
  static Socket connect_to(const std::string& host, int port, std::string& error) {
    char me[256] = {};
    ::gethostname(me, sizeof me - 1);
    const std::string target = host == me ? "127.0.0.1" : host;
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (const int rc = ::getaddrinfo(target.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0) {
      error = fmt::format("cannot resolve rank 0's host {}: {}", host, ::gai_strerror(rc));
      return Socket();
    }
    Socket s(::socket(AF_INET, SOCK_STREAM, 0));
    const bool ok = s.fd() >= 0 && ::connect(s.fd(), res->ai_addr, res->ai_addrlen) == 0;
    ::freeaddrinfo(res);
    if (!ok) {
      error = fmt::format("connecting to {}:{}: {}", host, port, std::strerror(errno));
      return Socket();
    }
    return s;
  }

  int rank_, size_;
  double timeout_s_;
  std::vector<Socket> peers_;  // rank 0: one per rank (peers_[0] unused); others: peers_[0] is rank 0
};

}  // namespace

std::unique_ptr<Communicator> make_tcp_communicator(int rank, int world, const std::filesystem::path& rendezvous,
                                                    double timeout_s) {
  return std::make_unique<TcpCommunicator>(rank, world, rendezvous, timeout_s);
}

}  // namespace fp8t
