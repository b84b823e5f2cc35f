#include "rendezvous/etcd/client.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <list>
#include <thread>
#include <utility>

#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/backoff.h"
#include "common/endpoint.h"
#include "common/log.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "rendezvous/auth/tls.h"
#include "rendezvous/grpc/callback_ticker.h"
#include "rendezvous/grpc/status.h"

namespace muster::etcd {

using etcdserverpb::AuthenticateRequest;
using etcdserverpb::AuthenticateResponse;
using etcdserverpb::DeleteRangeRequest;
using etcdserverpb::DeleteRangeResponse;
using etcdserverpb::LeaseGrantRequest;
using etcdserverpb::LeaseGrantResponse;
using etcdserverpb::LeaseKeepAliveRequest;
using etcdserverpb::LeaseKeepAliveResponse;
using etcdserverpb::LeaseRevokeRequest;
using etcdserverpb::LeaseRevokeResponse;
using etcdserverpb::PutRequest;
using etcdserverpb::PutResponse;
using etcdserverpb::RangeRequest;
using etcdserverpb::RangeResponse;
using etcdserverpb::TxnRequest;
using etcdserverpb::TxnResponse;
using etcdserverpb::WatchRequest;
using etcdserverpb::WatchResponse;

absl::StatusOr<EtcdEndpoints> ParseEtcdEndpoints(absl::string_view text) {
  constexpr absl::string_view kHint =
      "give HOST[:PORT] or [IPV6][:PORT], comma-separated, e.g. etcd1:2379,etcd2:2379 or "
      "[::1]:2379";
  if (absl::StripAsciiWhitespace(text).empty()) {
    return absl::InvalidArgumentError(absl::StrCat("no etcd endpoint given; ", kHint));
  }
  EtcdEndpoints result;
  std::optional<std::string> scheme_seen;  // "http" or "https", once an entry had one
  absl::flat_hash_set<std::string> seen;
  int index = 0;
  for (absl::string_view entry : absl::StrSplit(text, ',')) {
    ++index;
    entry = absl::StripAsciiWhitespace(entry);
    if (entry.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd endpoints \"", text, "\": entry ", index, " is empty; ", kHint));
    }
    const auto bad = [&](absl::string_view problem) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd endpoint \"", entry, "\": ", problem, "; ", kHint));
    };
    absl::string_view rest = entry;
    if (const size_t colons = rest.find("://"); colons != absl::string_view::npos) {
      const std::string scheme = absl::AsciiStrToLower(rest.substr(0, colons));
      if (scheme != "http" && scheme != "https") {
        return bad(absl::StrCat("the scheme \"", scheme,
                                "\" is not one etcd's gRPC is spoken over (http:// or https://)"));
      }
      if (scheme_seen && *scheme_seen != scheme) {
        return bad("http:// and https:// are mixed in one list; the members are reached alike");
      }
      scheme_seen = scheme;
      rest.remove_prefix(colons + 3);
    }
    absl::ConsumeSuffix(&rest, "/");
    if (absl::StrContains(rest, '/')) return bad("a path is not part of an etcd endpoint");
    absl::StatusOr<Endpoint> endpoint = ParseEndpoint(rest, kDefaultEtcdPort);
    if (!endpoint.ok()) {
      // ParseEndpoint's own hint names the rendezvous's port: keep only what is wrong.
      const absl::string_view message = endpoint.status().message();
      return bad(message.substr(0, message.find("; give ")));
    }
    if (endpoint->port == 0) return bad("the port must be a number from 1 to 65535");
    std::string formatted = FormatEndpoint(*endpoint);
    if (!seen.insert(formatted).second) return bad(absl::StrCat(formatted, " is listed twice"));
    result.endpoints.push_back(std::move(formatted));
  }
  result.tls = scheme_seen == "https";
  return result;
}

std::optional<std::string> EndpointOfUrl(absl::string_view url) {
  if (!absl::ConsumePrefix(&url, "http://") && !absl::ConsumePrefix(&url, "https://")) {
    return std::nullopt;
  }
  absl::ConsumeSuffix(&url, "/");
  if (url.empty() || url.find('/') != absl::string_view::npos) return std::nullopt;
  if (url.rfind(':') == absl::string_view::npos || url.back() == ']') return std::nullopt;
  return std::string(url);
}

etcdserverpb::TxnRequest FencedTxn(const std::string& key, int64_t create_revision) {
  etcdserverpb::TxnRequest txn;
  etcdserverpb::Compare* compare = txn.add_compare();
  compare->set_key(key);
  compare->set_target(etcdserverpb::Compare::CREATE);
  compare->set_result(etcdserverpb::Compare::EQUAL);
  compare->set_create_revision(create_revision);
  return txn;
}

EndpointServes ProbeEndpoint(const std::string& target, absl::Duration timeout) {
  std::unique_ptr<etcdserverpb::Maintenance::Stub> stub = etcdserverpb::Maintenance::NewStub(
      grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  etcdserverpb::StatusResponse response;
  const grpc::Status status = stub->Status(&context, etcdserverpb::StatusRequest(), &response);
  switch (status.error_code()) {
    case grpc::StatusCode::OK:
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::PERMISSION_DENIED: return EndpointServes::kEtcd;
    case grpc::StatusCode::UNIMPLEMENTED: return EndpointServes::kOther;
    default:  // not up yet, or too busy to say: ask again
      return EndpointServes::kNothingYet;
  }
}

std::string PrefixEnd(absl::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    const unsigned char last = static_cast<unsigned char>(end.back());
    if (last < 0xff) {
      end.back() = static_cast<char>(last + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

namespace {

// etcd's metadata (its rpctypes package): the auth token, and the demand
// that the member have a leader (else it answers "etcdserver: no leader" at
// once, and ends a stream once it has had none for 3 election timeouts).
constexpr char kTokenKey[] = "token";
constexpr char kAuthNotEnabled[] = "authentication is not enabled";
constexpr char kRequireLeaderKey[] = "hasleader";
constexpr char kRequireLeaderValue[] = "true";

constexpr int kMaxAttempts = 64;  // per call, besides its deadline
constexpr absl::Duration kMinBackoff = absl::Milliseconds(50);
constexpr absl::Duration kMaxCallBackoff = absl::Milliseconds(500);
constexpr absl::Duration kMaxStreamBackoff = absl::Seconds(1);
constexpr int64_t kPageKeys = 1000;
constexpr int kMaxPages = 1 << 20;
constexpr int kMaxGetPrefixRestarts = 3;
constexpr int kMaxLeaseIdTries = 3;

// A key as messages show it: binary keys stay readable.
std::string Quote(absl::string_view key) { return absl::StrCat("\"", absl::CHexEscape(key), "\""); }

absl::Status Annotate(const absl::Status& status, absl::string_view what,
                      absl::string_view endpoint) {
  return absl::Status(status.code(),
                      absl::StrCat(status.message(), " (", what, ", etcd at ", endpoint, ")"));
}

bool TokenRejected(absl::string_view message) {
  return absl::StrContains(message, "etcdserver: invalid auth token") ||
         absl::StrContains(message, "etcdserver: revision of auth store is old");
}

// What a failed attempt says about the call.
enum class Verdict {
  kFinal,          // the answer: return it
  kUnsent,         // etcd did nothing: any call may go on at another member
  kMaybeApplied,   // sent, outcome unknown: only a call safe to repeat goes on
  kTokenRejected,  // authenticate again and repeat
};

Verdict Judge(const grpc::Status& status, bool attempt_timed_out) {
  const std::string& message = status.error_message();
  switch (status.error_code()) {
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::INVALID_ARGUMENT:
      return TokenRejected(message) ? Verdict::kTokenRejected : Verdict::kFinal;
    case grpc::StatusCode::UNAVAILABLE:
      // Refused before anything was done: by gRPC (no connection), or by a
      // member that has no leader (asked with kRequireLeaderKey) or is still starting.
      if (absl::StrContains(message, "failed to connect to all addresses") ||
          message == "etcdserver: no leader" || message == "etcdserver: not capable" ||
          message == "etcdserver: unhealthy cluster") {
        return Verdict::kUnsent;
      }
      // Connection lost, leader changed, etcd's own request timeout.
      return Verdict::kMaybeApplied;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      // Refused before proposing: the member's apply lags its commits.
      return message == "etcdserver: too many requests" ? Verdict::kUnsent : Verdict::kFinal;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return attempt_timed_out ? Verdict::kMaybeApplied : Verdict::kFinal;
    default: return Verdict::kFinal;
  }
}

// Whether a transaction writes: a transaction that only reads may be repeated.
bool Writes(const TxnRequest& txn) {
  for (const auto* ops : {&txn.success(), &txn.failure()}) {
    for (const etcdserverpb::RequestOp& op : *ops) {
      if (op.has_request_put() || op.has_request_delete_range()) return true;
      if (op.has_request_txn() && Writes(op.request_txn())) return true;
    }
  }
  return false;
}

// Waits until the channel is READY or has failed (a call then fails at
// once, saying why), up to `deadline`. false: still connecting then.
bool Settle(grpc::Channel& channel, absl::Time deadline) {
  grpc_connectivity_state state = channel.GetState(/*try_to_connect=*/true);
  for (int i = 0; i < 16 && (state == GRPC_CHANNEL_IDLE || state == GRPC_CHANNEL_CONNECTING); ++i) {
    if (!channel.WaitForStateChange(state, absl::ToChronoTime(deadline))) return false;
    state = channel.GetState(/*try_to_connect=*/true);
  }
  return state != GRPC_CHANNEL_IDLE && state != GRPC_CHANNEL_CONNECTING;
}

grpc::ChannelArguments ChannelArguments(const EtcdOptions& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_response_bytes);
  // A member that restarts is used again within a second.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // A member whose host vanished without closing the connection is found by
  // pings. etcd takes them 5 s apart at the closest (--grpc-keepalive-min-time)
  // and only while a call is open; a quiet watch is pinged too.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  return args;
}

// Callbacks at given times on gRPC's executor threads (grpc::Alarm), so a
// lease or a watch needs no thread of its own.
class Timers {
 public:
  ~Timers() { Shutdown(); }

  // Runs `fn` at `when` (at once if past), unless Shutdown cancels it first.
  // false, and `fn` never runs: shut down already. `fn` may run while
  // Shutdown is under way: it checks its owner's state.
  bool Schedule(absl::Time when, std::function<void()> fn) ABSL_LOCKS_EXCLUDED(mu_) {
    Entry* entry;
    {
      absl::MutexLock lock(&mu_);
      if (shut_down_) return false;
      entries_.remove_if([](const Entry& e) { return e.done && e.armed; });
      entry = &entries_.emplace_back();
    }
    // grpc::Alarm keeps its state alive until the callback has returned,
    // however soon the Alarm object goes.
    entry->alarm.Set(absl::ToChronoTime(when), [this, entry, fn = std::move(fn)](bool fired) {
      if (fired) fn();
      absl::MutexLock lock(&mu_);
      entry->done = true;  // last: Shutdown may be waiting for it
    });
    {
      absl::MutexLock lock(&mu_);
      if (!shut_down_) {
        entry->armed = true;  // Shutdown cancels it from now on
        return true;
      }
    }
    // Shutdown began while the alarm was being set, and left it to us.
    entry->alarm.Cancel();
    absl::MutexLock lock(&mu_);
    entry->armed = true;
    return true;
  }

  // Cancels what has not run, and returns when no callback runs or can run.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<grpc::Alarm*> pending;
    {
      absl::MutexLock lock(&mu_);
      shut_down_ = true;
      for (Entry& entry : entries_) {
        if (entry.armed && !entry.done) pending.push_back(&entry.alarm);
      }
    }
    // Nothing removes entries any more (Schedule returns at once).
    for (grpc::Alarm* alarm : pending) alarm->Cancel();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](std::list<Entry>* entries) {
          return std::all_of(entries->begin(), entries->end(),
                             [](const Entry& e) { return e.done && e.armed; });
        },
        &entries_));
    entries_.clear();
  }

 private:
  struct Entry {
    grpc::Alarm alarm;
    // Schedule is done with it: Shutdown cancels it, and it may be destroyed once done.
    bool armed = false;
    bool done = false;  // the callback has run, or been cancelled
  };
  absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::list<Entry> entries_ ABSL_GUARDED_BY(mu_);  // a list: entries do not move
};

struct Member {
  std::string endpoint;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<etcdserverpb::KV::Stub> kv;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease;
  std::unique_ptr<etcdserverpb::Watch::Stub> watch;
  std::unique_ptr<etcdserverpb::Auth::Stub> auth;
  std::unique_ptr<etcdserverpb::Cluster::Stub> cluster;
};

// How a call may go on at another member after an attempt failed.
enum class Repeat {
  kAlways,    // repeating it is safe (reads; writes the caller made idempotent)
  kIfUnsent,  // only when etcd cannot have received the attempt
};

template <typename Response>
using Rpc = std::function<grpc::Status(Member&, grpc::ClientContext*, Response*)>;

// What the client, its keepers and its watches share: the members, the one
// calls go to, the auth token. Thread-safe. Members are only ever added
// (SetEndpoints): one that left is retired, skipped when calls move on, so
// that an index stays a member for the client's life.
class Cluster {
 public:
  Cluster(EtcdOptions options, std::shared_ptr<grpc::ChannelCredentials> credentials)
      : options_(std::move(options)), credentials_(std::move(credentials)),
        logger_(Logger("etcd")) {
    absl::MutexLock lock(&mu_);
    for (const std::string& endpoint : options_.endpoints) Add(endpoint);
  }

  const EtcdOptions& options() const { return options_; }
  int size() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(members_.size());
  }
  // Never moves: members_ is only appended to.
  Member& member(int index) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return members_[index];
  }

  std::vector<std::string> Endpoints() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> out;
    for (size_t i = 0; i < members_.size(); ++i) {
      if (!retired_[i]) out.push_back(members_[i].endpoint);
    }
    return out;
  }

  // Calls and new streams go to `endpoints` from now on: those not known
  // yet are added, the others retired (unless that would leave none).
  void SetEndpoints(const std::vector<std::string>& endpoints) ABSL_LOCKS_EXCLUDED(mu_) {
    if (endpoints.empty()) return;
    absl::MutexLock lock(&mu_);
    const absl::flat_hash_set<std::string> wanted(endpoints.begin(), endpoints.end());
    for (size_t i = 0; i < members_.size(); ++i) {
      const bool retire = !wanted.contains(members_[i].endpoint);
      if (retire != retired_[i]) {
        logger_->info("etcd at {} {}", members_[i].endpoint,
                      retire ? "is no longer a member; calls go elsewhere" : "is a member again");
      }
      retired_[i] = retire;
    }
    for (const std::string& endpoint : endpoints) {
      const bool known = std::any_of(members_.begin(), members_.end(),
                                     [&](const Member& m) { return m.endpoint == endpoint; });
      if (!known) {
        Add(endpoint);
        logger_->info("etcd at {} is a new member", endpoint);
      }
    }
    if (retired_[current_]) current_ = NextLive(current_);
  }
  spdlog::logger& logger() { return *logger_; }

  // The member calls and new streams go to.
  int Current() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return current_;
  }

  // Member `index` answered.
  void Succeeded(int index) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (failing_[index]) {
      failing_[index] = false;
      logger_->info("etcd at {} answers again", members_[index].endpoint);
    }
  }

  // Member `index` failed (`why`, for the log): calls go on at the next
  // member, unless another failure has moved them already.
  void Failed(int index, absl::string_view why) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (current_ == index) current_ = NextLive(index);
    const spdlog::level::level_enum level =
        failing_[index] ? spdlog::level::debug : spdlog::level::info;
    failing_[index] = true;
    logger_->log(level, "etcd at {} failed ({}); going on with etcd at {}",
                 members_[index].endpoint, why, members_[current_].endpoint);
  }

  // The auth token ("" without a user), authenticating first when none is
  // held: that blocks for up to call_timeout.
  absl::StatusOr<std::string> Token() ABSL_LOCKS_EXCLUDED(mu_, auth_mu_) {
    if (options_.user.empty()) return std::string();
    {
      absl::MutexLock lock(&mu_);
      if (!token_.empty()) return token_;
    }
    absl::MutexLock auth_lock(&auth_mu_);  // one Authenticate at a time
    {
      absl::MutexLock lock(&mu_);
      if (!token_.empty()) return token_;
    }
    AuthenticateRequest request;
    request.set_name(options_.user);
    request.set_password(options_.password);
    absl::StatusOr<AuthenticateResponse> response = Call<AuthenticateResponse>(
        absl::StrCat("Authenticate as ", options_.user), Repeat::kAlways, /*authenticated=*/false,
        [&request](Member& member, grpc::ClientContext* context, AuthenticateResponse* out) {
          return member.auth->Authenticate(context, request, out);
        });
    if (!response.ok()) return response.status();
    absl::MutexLock lock(&mu_);
    token_ = response->token();
    return token_;
  }

  // etcd refused `token` (expired, or the auth store changed): the next
  // Token() authenticates again.
  void TokenRejected(absl::string_view token) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (token_ == token) token_.clear();
  }

  // One blocking call: attempts of at most attempt_timeout, at the current
  // member and on round the others as `repeat` allows, within call_timeout.
  // `maybe_applied`, when given, tells whether an attempt before the last
  // one may have been applied (a repeat may find its own work done).
  template <typename Response>
  absl::StatusOr<Response> Call(absl::string_view what, Repeat repeat, bool authenticated,
                                const Rpc<Response>& rpc, bool* maybe_applied = nullptr) {
    const absl::Time deadline = absl::Now() + options_.call_timeout;
    Backoff backoff(kMinBackoff, kMaxCallBackoff);
    int failures = 0;
    bool token_renewed = false;
    bool sent = false;
    std::string last_error = "no attempt was made";
    if (maybe_applied != nullptr) *maybe_applied = false;
    for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
      if (absl::Now() >= deadline) break;
      std::string token;
      if (authenticated) {
        absl::StatusOr<std::string> got = Token();  // may authenticate first
        if (!got.ok() && absl::StrContains(got.status().message(), kAuthNotEnabled)) {
          // A cluster being set up (EnableRootAuth): ask again shortly.
          last_error = std::string(got.status().message());
          absl::SleepFor(std::min(backoff.Next(), deadline - absl::Now()));
          continue;
        }
        if (!got.ok()) return got.status();
        token = *std::move(got);
      }
      const int index = Current();
      Member& member = this->member(index);
      const absl::Time attempt_deadline =
          std::min(deadline, absl::Now() + options_.attempt_timeout);
      grpc::Status status;
      Response response;
      if (!Settle(*member.channel, attempt_deadline)) {
        status = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                              "failed to connect to all addresses; still connecting after " +
                                  absl::FormatDuration(options_.attempt_timeout));
      } else {
        grpc::ClientContext context;
        context.set_deadline(absl::ToChronoTime(attempt_deadline));
        context.AddMetadata(kRequireLeaderKey, kRequireLeaderValue);
        if (!token.empty()) context.AddMetadata(kTokenKey, token);
        status = rpc(member, &context, &response);
      }
      if (status.ok()) {
        Succeeded(index);
        return response;
      }
      const bool attempt_timed_out =
          status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && attempt_deadline < deadline;
      last_error = absl::StrCat(member.endpoint, ": ", status.error_message());
      switch (Judge(status, attempt_timed_out)) {
        case Verdict::kFinal: return Annotate(rdzv::FromGrpcStatus(status), what, member.endpoint);
        case Verdict::kTokenRejected:
          if (token_renewed) return Annotate(rdzv::FromGrpcStatus(status), what, member.endpoint);
          token_renewed = true;
          TokenRejected(token);
          continue;
        case Verdict::kMaybeApplied:
          if (repeat == Repeat::kIfUnsent) {
            return absl::UnavailableError(absl::StrCat(
                what, ": etcd at ", member.endpoint, " did not answer (", status.error_message(),
                "); it may or may not have been applied: read back to know"));
          }
          sent = true;
          if (maybe_applied != nullptr) *maybe_applied = true;
          break;
        case Verdict::kUnsent: break;
      }
      Failed(index, attempt_timed_out ? absl::StrCat("no answer within ",
                                                     absl::FormatDuration(options_.attempt_timeout))
                                      : status.error_message());
      if (++failures % LiveCount() == 0) {
        // Every member failed once more: give an election time to end.
        absl::SleepFor(std::min(backoff.Next(), deadline - absl::Now()));
      }
    }
    return absl::UnavailableError(absl::StrCat(
        what, ": no etcd member answered within ", absl::FormatDuration(options_.call_timeout),
        sent && repeat == Repeat::kAlways ? " (an attempt may have been applied)" : "",
        "; last error: ", last_error, TlsHint(last_error)));
  }

 private:
  // What to check of the certificates when TLS is on and connections fail
  // for another reason than nobody listening.
  std::string TlsHint(absl::string_view error) const {
    if (options_.tls.empty() || absl::StrContains(error, "Connection refused") ||
        !absl::StrContains(error, "failed to connect")) {
      return "";
    }
    return absl::StrCat(" (TLS: check that ", options_.tls.cacert,
                        " signed the members' certificates and that they name the hosts of "
                        "their endpoints",
                        options_.tls.cert.empty()
                            ? ", and whether the members want a client certificate"
                            : absl::StrCat(", and that the members trust the authority that "
                                           "signed ",
                                           options_.tls.cert),
                        ")");
  }

  // REQUIRES: mu_ held.
  void Add(const std::string& endpoint) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Member& member = members_.emplace_back();
    member.endpoint = endpoint;
    member.channel = grpc::CreateCustomChannel(endpoint, credentials_, ChannelArguments(options_));
    member.kv = etcdserverpb::KV::NewStub(member.channel);
    member.lease = etcdserverpb::Lease::NewStub(member.channel);
    member.watch = etcdserverpb::Watch::NewStub(member.channel);
    member.auth = etcdserverpb::Auth::NewStub(member.channel);
    member.cluster = etcdserverpb::Cluster::NewStub(member.channel);
    failing_.push_back(false);
    retired_.push_back(false);
  }

  // The member after `index` that is not retired (`index` itself if none is).
  int NextLive(int index) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int count = static_cast<int>(members_.size());
    for (int step = 1; step <= count; ++step) {
      const int next = (index + step) % count;
      if (!retired_[next]) return next;
    }
    return index;
  }

  int LiveCount() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return std::max<int>(1, static_cast<int>(std::count(retired_.begin(), retired_.end(), false)));
  }

  const EtcdOptions options_;
  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  // Without it, a watch event that comes after a quiet second can wait
  // 100 ms for gRPC's callback threads (callback_ticker.h).
  const std::shared_ptr<rdzv::CallbackTicker> ticker_ = rdzv::CallbackTicker::Acquire();
  const std::shared_ptr<spdlog::logger> logger_;

  absl::Mutex auth_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  std::deque<Member> members_ ABSL_GUARDED_BY(mu_);  // appended to only: entries never move
  int current_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<bool> failing_ ABSL_GUARDED_BY(mu_);  // for the log: a member's first failure
  std::vector<bool> retired_ ABSL_GUARDED_BY(mu_);  // no longer a member (SetEndpoints)
  std::string token_ ABSL_GUARDED_BY(mu_);
};

// Ends a keeper's or a watcher's streams, as its destructor must: no new
// stream opens (`*stopping`), the current one is cancelled, no timer runs
// any more, and it returns once every stream's OnDone has finished
// (`*streams` back to 0). `stopping`, `current` and `streams` are guarded
// by `mu`.
template <typename Stream>
void StopStreams(absl::Mutex& mu, bool* stopping, std::shared_ptr<Stream>* current, Timers& timers,
                 int* streams) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  std::shared_ptr<Stream> stream;
  {
    absl::MutexLock lock(&mu);
    *stopping = true;
    stream = *current;
  }
  if (stream) stream->Cancel();
  stream.reset();
  timers.Shutdown();
  absl::MutexLock lock(&mu);
  mu.Await(absl::Condition(
      +[](int* left) { return *left == 0; }, streams));
}

// ---------------------------------------------------------------- leases

class Keeper final : public LeaseKeeper {
 public:
  Keeper(std::shared_ptr<Cluster> cluster, int64_t lease, absl::Duration ttl,
         std::function<void(absl::Status)> on_lost)
      : cluster_(std::move(cluster)), lease_(lease), ttl_(std::max(ttl, absl::Seconds(1))),
        interval_(ttl_ / 3), on_lost_(std::move(on_lost)) {}

  ~Keeper() override;

  void Start() {
    {
      absl::MutexLock lock(&mu_);
      renewed_at_ = absl::Now();
    }
    // From timers: Open may authenticate first, and KeepAlive does not block.
    timers_.Schedule(absl::Now(), [this] { Open(); });
    timers_.Schedule(absl::Now() + interval_, [this] { Tick(); });
  }

 private:
  class Stream;

  std::string Name() const { return absl::StrFormat("etcd lease %x", lease_); }
  void Open() ABSL_LOCKS_EXCLUDED(mu_);
  void Tick() ABSL_LOCKS_EXCLUDED(mu_);
  void Renewed(Stream* stream, int64_t ttl) ABSL_LOCKS_EXCLUDED(mu_);
  void StreamDone(Stream* stream, const grpc::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  void StreamGone() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    --streams_;
  }

  const std::shared_ptr<Cluster> cluster_;
  const int64_t lease_;
  const absl::Duration ttl_;
  const absl::Duration interval_;
  const std::function<void(absl::Status)> on_lost_;
  Timers timers_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool lost_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<Stream> stream_ ABSL_GUARDED_BY(mu_);
  // When etcd last answered a keep-alive with TTL > 0 (at first: Start).
  absl::Time renewed_at_ ABSL_GUARDED_BY(mu_);
  // When the oldest keep-alive without an answer was sent; InfiniteFuture: none.
  absl::Time sent_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::string last_error_ ABSL_GUARDED_BY(mu_) = "none";
  // Streams whose OnDone has not finished: the destructor waits for 0.
  int streams_ ABSL_GUARDED_BY(mu_) = 0;
};

// One LeaseKeepAlive stream at one member. Writes come from the keeper's
// ticks (outside reactions), so a hold keeps OnDone back until no write can
// start any more: reads done (the stream ended) and no write in flight.
class Keeper::Stream final
    : public grpc::ClientBidiReactor<LeaseKeepAliveRequest, LeaseKeepAliveResponse> {
 public:
  Stream(Keeper* keeper, int member, std::string token)
      : keeper_(keeper), member_(member), token_(std::move(token)) {
    request_.set_id(keeper->lease_);
  }

  int member() const { return member_; }
  const std::string& token() const { return token_; }

  // Starts the call with a keep-alive; keeps the stream alive until OnDone.
  void Start(std::shared_ptr<Stream> self, Member& member) {
    self_ = std::move(self);
    if (!token_.empty()) context_.AddMetadata(kTokenKey, token_);
    // No kRequireLeaderKey: a member without a leader holds the keep-alive
    // until one is elected, which beats failing it.
    member.lease->async()->LeaseKeepAlive(&context_, this);
    AddHold();
    {
      absl::MutexLock lock(&mu_);
      writing_ = true;
    }
    StartWrite(&request_);
    StartRead(&response_);
    StartCall();
  }

  // Sends a keep-alive, unless one is still being written or the stream has ended.
  void Send() ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || reads_done_) return;
      writing_ = true;
    }
    StartWrite(&request_);
  }

  void Cancel() { context_.TryCancel(); }

  void OnWriteDone(bool ok) override {
    bool release;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      release = reads_done_;
    }
    if (release) RemoveHold();
  }

  void OnReadDone(bool ok) override {
    if (ok) {
      keeper_->Renewed(this, response_.ttl());
      StartRead(&response_);
      return;
    }
    bool release;
    {
      absl::MutexLock lock(&mu_);
      reads_done_ = true;
      release = !writing_;
    }
    if (release) RemoveHold();
  }

  void OnDone(const grpc::Status& status) override {
    Keeper* const keeper = keeper_;
    keeper->StreamDone(this, status);
    // This stream and its gRPC call go before the keeper's destructor may
    // go on (see rendezvous/client/client.cc, WatchStream::OnDone).
    std::shared_ptr<Stream> self = std::move(self_);
    self.reset();  // may delete this
    keeper->StreamGone();
  }

  // Guarded by the keeper's mu_.
  absl::Time opened_at;
  bool answered = false;

 private:
  Keeper* const keeper_;
  const int member_;
  const std::string token_;
  std::shared_ptr<Stream> self_;
  grpc::ClientContext context_;
  LeaseKeepAliveRequest request_;
  LeaseKeepAliveResponse response_;
  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
};

Keeper::~Keeper() { StopStreams(mu_, &stopping_, &stream_, timers_, &streams_); }

void Keeper::Open() {
  const int index = cluster_->Current();
  absl::StatusOr<std::string> token = cluster_->Token();
  std::shared_ptr<Stream> stream;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ || lost_ || stream_ != nullptr) return;
    if (!token.ok()) {
      last_error_ = std::string(token.status().message());
      return;  // the next tick tries again
    }
    stream = std::make_shared<Stream>(this, index, *token);
    stream->opened_at = absl::Now();
    stream_ = stream;
    ++streams_;
    if (sent_at_ == absl::InfiniteFuture()) sent_at_ = stream->opened_at;
  }
  stream->Start(stream, cluster_->member(index));
}

void Keeper::Tick() {
  absl::Status lost;
  std::shared_ptr<Stream> cancel;
  std::shared_ptr<Stream> send;
  bool open = false;
  absl::Time next;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ || lost_) return;
    const absl::Time now = absl::Now();
    if (now - renewed_at_ >= ttl_) {
      lost_ = true;
      lost = absl::DeadlineExceededError(absl::StrCat("no keep-alive of ", Name(),
                                                      " succeeded for ", absl::FormatDuration(ttl_),
                                                      " (last error: ", last_error_, ")"));
      cancel = stream_;
    } else {
      if (stream_ == nullptr) {
        open = true;
      } else if (sent_at_ != absl::InfiniteFuture() && now - sent_at_ >= interval_) {
        // No answer by now: that member is stuck (partitioned, or the
        // keep-alive was lost with a leader). StreamDone reopens elsewhere.
        last_error_ =
            absl::StrCat("etcd at ", cluster_->member(stream_->member()).endpoint,
                         " did not answer a keep-alive within ", absl::FormatDuration(interval_));
        cancel = stream_;
      } else {
        send = stream_;
        if (sent_at_ == absl::InfiniteFuture()) sent_at_ = now;
      }
      next = std::min(now + interval_, renewed_at_ + ttl_);
    }
  }
  if (cancel) cancel->Cancel();
  if (send) send->Send();
  if (open) Open();
  if (!lost.ok()) {
    // on_lost's owner says what it means (etcd away, or the lease gone).
    cluster_->logger().debug("{}", lost.message());
    on_lost_(lost);
    return;
  }
  timers_.Schedule(next, [this] { Tick(); });
}

void Keeper::Renewed(Stream* stream, int64_t ttl) {
  absl::Status lost;
  std::shared_ptr<Stream> cancel;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ || lost_) return;
    if (ttl <= 0) {
      lost_ = true;
      lost = absl::NotFoundError(absl::StrCat(Name(), " has expired or was revoked"));
      cancel = stream_;
    } else {
      renewed_at_ = absl::Now();
      sent_at_ = absl::InfiniteFuture();
      stream->answered = true;
    }
  }
  if (cancel) cancel->Cancel();
  if (!lost.ok()) {
    cluster_->logger().debug("{}", lost.message());
    on_lost_(lost);
  } else {
    cluster_->Succeeded(stream->member());
  }
}

void Keeper::StreamDone(Stream* stream, const grpc::Status& status) {
  bool reopen;
  {
    absl::MutexLock lock(&mu_);
    if (stream_.get() == stream) stream_.reset();
    if (stopping_ || lost_) return;
    last_error_ = absl::StrCat("etcd at ", cluster_->member(stream->member()).endpoint, ": ",
                               status.ok() ? "the stream ended" : status.error_message());
    sent_at_ = absl::InfiniteFuture();
    // A stream that failed at once waits for the next tick: no busy loop
    // while every member is down.
    reopen = stream->answered || absl::Now() - stream->opened_at >= interval_ / 2;
  }
  if (TokenRejected(status.error_message())) cluster_->TokenRejected(stream->token());
  cluster_->Failed(stream->member(),
                   status.ok() ? "lease keep-alive stream ended" : status.error_message());
  // From a timer, not this gRPC callback thread: Open may authenticate first.
  if (reopen) timers_.Schedule(absl::Now(), [this] { Open(); });
}

// ---------------------------------------------------------------- watches

class Watcher final : public EtcdWatch {
 public:
  Watcher(std::shared_ptr<Cluster> cluster, std::string key, std::string range_end,
          int64_t start_revision,
          std::function<void(const std::vector<mvccpb::Event>&, int64_t)> on_events,
          std::function<void(absl::Status)> on_end)
      : cluster_(std::move(cluster)), key_(std::move(key)), range_end_(std::move(range_end)),
        on_events_(std::move(on_events)), on_end_(std::move(on_end)),
        next_revision_(std::max<int64_t>(start_revision, 0)) {}

  ~Watcher() override;

  // From a timer: Open may authenticate first, and Watch does not block.
  void Start() {
    timers_.Schedule(absl::Now(), [this] { Open(); });
  }

 private:
  class Stream;

  std::string Name() const {
    return range_end_.empty()
               ? absl::StrCat("etcd watch of ", Quote(key_))
               : absl::StrCat("etcd watch of [", Quote(key_), ", ", Quote(range_end_), ")");
  }
  void Open() ABSL_LOCKS_EXCLUDED(mu_);
  void CheckCreated(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  // false: the watch has ended, read no more.
  bool Response(Stream* stream, WatchResponse& response) ABSL_LOCKS_EXCLUDED(mu_);
  void StreamDone(Stream* stream, const grpc::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  // Reopens after a backoff, or ends the watch with `status` when retrying cannot help.
  void Retry(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  void End(absl::Status status) ABSL_LOCKS_EXCLUDED(mu_);
  void StreamGone() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    --streams_;
  }

  const std::shared_ptr<Cluster> cluster_;
  const std::string key_;
  const std::string range_end_;
  const std::function<void(const std::vector<mvccpb::Event>&, int64_t)> on_events_;
  const std::function<void(absl::Status)> on_end_;
  Timers timers_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  // The revision to watch from: the one after the last event delivered
  // (0: from now on, until the first stream says where now is).
  int64_t next_revision_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Stream> stream_ ABSL_GUARDED_BY(mu_);
  uint64_t opened_ ABSL_GUARDED_BY(mu_) = 0;
  Backoff backoff_ ABSL_GUARDED_BY(mu_){kMinBackoff, kMaxStreamBackoff};
  // Streams whose OnDone has not finished: the destructor waits for 0.
  int streams_ ABSL_GUARDED_BY(mu_) = 0;
};

// One Watch stream at one member, for one watch. Its only write, the
// create request, is started with the call.
class Watcher::Stream final : public grpc::ClientBidiReactor<WatchRequest, WatchResponse> {
 public:
  Stream(Watcher* watcher, uint64_t id, int member, std::string token, WatchRequest create)
      : watcher_(watcher), id_(id), member_(member), token_(std::move(token)),
        create_(std::move(create)) {}

  uint64_t id() const { return id_; }
  int member() const { return member_; }
  const std::string& token() const { return token_; }

  void Start(std::shared_ptr<Stream> self, Member& member) {
    self_ = std::move(self);
    context_.AddMetadata(kRequireLeaderKey, kRequireLeaderValue);
    if (!token_.empty()) context_.AddMetadata(kTokenKey, token_);
    member.watch->async()->Watch(&context_, this);
    StartWrite(&create_);
    StartRead(&response_);
    StartCall();
  }

  void Cancel() { context_.TryCancel(); }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    if (watcher_->Response(this, response_)) {
      StartRead(&response_);
    } else {
      Cancel();  // the server would keep the stream open
    }
  }

  void OnDone(const grpc::Status& status) override {
    Watcher* const watcher = watcher_;
    watcher->StreamDone(this, status);
    std::shared_ptr<Stream> self = std::move(self_);
    self.reset();  // may delete this
    watcher->StreamGone();
  }

  // Guarded by the watcher's mu_.
  bool created = false;
  absl::Status refused;  // why etcd cancelled the watch on this stream, if it did

 private:
  Watcher* const watcher_;
  const uint64_t id_;
  const int member_;
  const std::string token_;
  const WatchRequest create_;
  std::shared_ptr<Stream> self_;
  grpc::ClientContext context_;
  WatchResponse response_;
};

Watcher::~Watcher() { StopStreams(mu_, &stopping_, &stream_, timers_, &streams_); }

void Watcher::Open() {
  const int index = cluster_->Current();
  absl::StatusOr<std::string> token = cluster_->Token();
  if (!token.ok()) {
    Retry(token.status());
    return;
  }
  std::shared_ptr<Stream> stream;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ || ended_ || stream_ != nullptr) return;
    WatchRequest request;
    etcdserverpb::WatchCreateRequest* create = request.mutable_create_request();
    create->set_key(key_);
    create->set_range_end(range_end_);
    create->set_start_revision(next_revision_);
    stream =
        std::make_shared<Stream>(this, ++opened_, index, *std::move(token), std::move(request));
    stream_ = stream;
    ++streams_;
  }
  const uint64_t id = stream->id();
  stream->Start(stream, cluster_->member(index));
  // A member that takes the connection but does not answer (a host gone
  // quiet) is left for the next one.
  timers_.Schedule(absl::Now() + cluster_->options().attempt_timeout,
                   [this, id] { CheckCreated(id); });
}

void Watcher::CheckCreated(uint64_t id) {
  std::shared_ptr<Stream> cancel;
  {
    absl::MutexLock lock(&mu_);
    if (stream_ != nullptr && stream_->id() == id && !stream_->created) cancel = stream_;
  }
  if (cancel) cancel->Cancel();
}

bool Watcher::Response(Stream* stream, WatchResponse& response) {
  std::vector<mvccpb::Event> events;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ || ended_) return false;
    if (response.canceled()) {
      const std::string& reason = response.cancel_reason();
      if (response.compact_revision() > 0) {
        stream->refused = absl::OutOfRangeError(
            absl::StrCat(Name(), " from revision ", next_revision_,
                         " ended: that revision has been compacted (compact revision ",
                         response.compact_revision(),
                         "); read the keys again and watch from the read's revision + 1"));
      } else if (TokenRejected(reason)) {
        stream->refused = absl::UnauthenticatedError(reason);  // retried with a new token
      } else {
        stream->refused = absl::Status(absl::StrContains(reason, "permission denied")
                                           ? absl::StatusCode::kPermissionDenied
                                           : absl::StatusCode::kFailedPrecondition,
                                       absl::StrCat("etcd cancelled the ", Name(), ": ",
                                                    reason.empty() ? "no reason given" : reason));
      }
      return false;
    }
    if (response.created()) {
      stream->created = true;
      backoff_.Reset();
      // From now on: now is the revision the member was at.
      if (next_revision_ == 0) next_revision_ = response.header().revision() + 1;
    }
    for (mvccpb::Event& event : *response.mutable_events()) {
      // A member never sends what was asked not to be, but a repeat would be
      // a bug the user could not see.
      if (event.kv().mod_revision() < next_revision_) continue;
      events.push_back(std::move(event));
    }
    if (events.empty()) return true;
    next_revision_ = events.back().kv().mod_revision() + 1;
  }
  on_events_(events, response.header().revision());
  return true;
}

void Watcher::StreamDone(Stream* stream, const grpc::Status& status) {
  absl::Status refused;
  bool created;
  int64_t from;
  {
    absl::MutexLock lock(&mu_);
    if (stream_.get() == stream) stream_.reset();
    if (stopping_ || ended_) return;
    refused = stream->refused;
    created = stream->created;
    from = next_revision_;
  }
  const std::string& endpoint = cluster_->member(stream->member()).endpoint;
  if (!refused.ok()) {
    if (refused.code() != absl::StatusCode::kUnauthenticated) {
      End(refused);
      return;
    }
    cluster_->TokenRejected(stream->token());
    Retry(refused);
    return;
  }
  if (TokenRejected(status.error_message())) cluster_->TokenRejected(stream->token());
  switch (status.error_code()) {
    case grpc::StatusCode::OK:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::UNAUTHENTICATED: break;
    default:
      // A response over max_response_bytes, a request etcd refuses: the
      // same at every member.
      End(Annotate(rdzv::FromGrpcStatus(status), Name(), endpoint));
      return;
  }
  const std::string why = status.ok() ? "the watch stream ended" : status.error_message();
  cluster_->Failed(stream->member(), why);
  // Failed() has said, once, that the member fails.
  cluster_->logger().debug("{}: the stream to {} ended ({}); reopening from revision {}", Name(),
                           endpoint, why, from == 0 ? "now" : absl::StrCat(from));
  if (created) {
    // It had worked: at once, at the next member; from a timer, not this
    // gRPC callback thread, as Open may authenticate first.
    timers_.Schedule(absl::Now(), [this] { Open(); });
  } else {
    Retry(absl::UnavailableError(why));
  }
}

void Watcher::Retry(const absl::Status& status) {
  if (!absl::IsUnavailable(status) && !absl::IsDeadlineExceeded(status) &&
      !absl::IsUnauthenticated(status) && !absl::IsCancelled(status)) {
    End(status);  // e.g. a password etcd refuses
    return;
  }
  absl::Duration delay;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ || ended_) return;
    delay = backoff_.Next();
  }
  timers_.Schedule(absl::Now() + delay, [this] { Open(); });
}

void Watcher::End(absl::Status status) {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ || ended_) return;
    ended_ = true;
  }
  cluster_->logger().warn("{}", status.message());
  on_end_(std::move(status));
}

// ---------------------------------------------------------------- the client

class EtcdClientImpl final : public EtcdClient {
 public:
  explicit EtcdClientImpl(std::shared_ptr<Cluster> cluster) : cluster_(std::move(cluster)) {
    const absl::Duration interval = cluster_->options().auto_sync_interval;
    if (interval > absl::ZeroDuration()) {
      syncer_ = std::thread([this, interval] {
        while (!stop_sync_.WaitForNotificationWithTimeout(interval)) SyncEndpoints();
      });
    }
  }

  ~EtcdClientImpl() override {
    stop_sync_.Notify();
    if (syncer_.joinable()) syncer_.join();
  }

  absl::StatusOr<int64_t> Put(absl::string_view key, absl::string_view value,
                              int64_t lease) override {
    PutRequest request;
    request.set_key(std::string(key));
    request.set_value(std::string(value));
    request.set_lease(lease);
    absl::StatusOr<PutResponse> response = cluster_->Call<PutResponse>(
        absl::StrCat("Put ", Quote(key)), Repeat::kAlways, true,
        [&request](Member& member, grpc::ClientContext* context, PutResponse* out) {
          return member.kv->Put(context, request, out);
        });
    if (!response.ok()) return response.status();
    return response->header().revision();
  }

  absl::StatusOr<GetResult> Get(absl::string_view key) override {
    RangeRequest request;
    request.set_key(std::string(key));
    absl::StatusOr<RangeResponse> response = Range(absl::StrCat("Get ", Quote(key)), request);
    if (!response.ok()) return response.status();
    GetResult result;
    result.revision = response->header().revision();
    if (response->kvs_size() > 0) result.kv = std::move(*response->mutable_kvs(0));
    return result;
  }

  absl::StatusOr<RangeResult> GetPrefix(absl::string_view prefix) override {
    const std::string what = absl::StrCat("GetPrefix ", Quote(prefix));
    const std::string first = prefix.empty() ? std::string(1, '\0') : std::string(prefix);
    int64_t limit = kPageKeys;
    for (int restart = 0; restart <= kMaxGetPrefixRestarts; ++restart) {
      RangeResult result;
      RangeRequest request;
      request.set_key(first);
      request.set_range_end(PrefixEnd(prefix));
      absl::Status failed;
      for (int page = 0; page < kMaxPages; ++page) {
        request.set_limit(limit);
        absl::StatusOr<RangeResponse> response = Range(what, request);
        if (absl::IsResourceExhausted(response.status()) && limit > 1 &&
            absl::StrContains(response.status().message(), "larger than max")) {
          limit = std::max<int64_t>(1, limit / 2);  // over max_response_bytes: smaller pages
          continue;
        }
        if (!response.ok()) {
          failed = response.status();
          break;
        }
        if (request.revision() == 0) {
          // Every later page at the first one's revision: one snapshot.
          result.revision = response->header().revision();
          request.set_revision(result.revision);
        }
        for (mvccpb::KeyValue& kv : *response->mutable_kvs()) result.kvs.push_back(std::move(kv));
        if (!response->more() || result.kvs.empty()) return result;
        request.set_key(result.kvs.back().key() + std::string(1, '\0'));
      }
      // The pinned revision compacted away between two pages: read afresh.
      if (absl::IsOutOfRange(failed) && request.revision() != 0 &&
          absl::StrContains(failed.message(), "compacted")) {
        continue;
      }
      if (!failed.ok()) return failed;
      return absl::InternalError(absl::StrCat(what, ": more than ", kMaxPages, " pages"));
    }
    return absl::UnavailableError(
        absl::StrCat(what, ": the revision read was compacted away before the last page, ",
                     kMaxGetPrefixRestarts + 1, " times"));
  }

  absl::StatusOr<int64_t> Delete(absl::string_view key) override {
    DeleteRangeRequest request;
    request.set_key(std::string(key));
    return DeleteRange(absl::StrCat("Delete ", Quote(key)), request);
  }

  absl::StatusOr<int64_t> DeletePrefix(absl::string_view prefix) override {
    if (prefix.empty()) {
      return absl::InvalidArgumentError("DeletePrefix \"\": that would delete every key in etcd");
    }
    DeleteRangeRequest request;
    request.set_key(std::string(prefix));
    request.set_range_end(PrefixEnd(prefix));
    return DeleteRange(absl::StrCat("DeletePrefix ", Quote(prefix)), request);
  }

  absl::StatusOr<TxnResponse> Txn(const TxnRequest& request) override {
    return cluster_->Call<TxnResponse>(
        "Txn", Writes(request) ? Repeat::kIfUnsent : Repeat::kAlways, true,
        [&request](Member& member, grpc::ClientContext* context, TxnResponse* out) {
          return member.kv->Txn(context, request, out);
        });
  }

  absl::StatusOr<int64_t> GrantLease(absl::Duration ttl) override {
    const int64_t seconds =
        std::max<int64_t>(1, absl::ToInt64Seconds(absl::Ceil(ttl, absl::Seconds(1))));
    for (int i = 0; i < kMaxLeaseIdTries; ++i) {
      LeaseGrantRequest request;
      request.set_ttl(seconds);
      // Our own id, so that a repeated grant finds its lease rather than making another.
      request.set_id(NewLeaseId());
      bool maybe_applied = false;
      absl::StatusOr<LeaseGrantResponse> response = cluster_->Call<LeaseGrantResponse>(
          absl::StrFormat("GrantLease %x", request.id()), Repeat::kAlways, true,
          [&request](Member& member, grpc::ClientContext* context, LeaseGrantResponse* out) {
            return member.lease->LeaseGrant(context, request, out);
          },
          &maybe_applied);
      if (response.ok()) {
        if (!response->error().empty()) return absl::UnknownError(response->error());
        return response->id();
      }
      if (!absl::IsFailedPrecondition(response.status()) ||
          !absl::StrContains(response.status().message(), "lease already exists")) {
        return response.status();
      }
      if (maybe_applied) return request.id();  // granted by an attempt whose answer was lost
    }
    return absl::InternalError(
        absl::StrCat("GrantLease: ", kMaxLeaseIdTries, " random lease ids were all taken"));
  }

  absl::Status RevokeLease(int64_t lease) override {
    LeaseRevokeRequest request;
    request.set_id(lease);
    bool maybe_applied = false;
    absl::StatusOr<LeaseRevokeResponse> response = cluster_->Call<LeaseRevokeResponse>(
        absl::StrFormat("RevokeLease %x", lease), Repeat::kAlways, true,
        [&request](Member& member, grpc::ClientContext* context, LeaseRevokeResponse* out) {
          return member.lease->LeaseRevoke(context, request, out);
        },
        &maybe_applied);
    // Revoked by an attempt whose answer was lost.
    if (absl::IsNotFound(response.status()) && maybe_applied) return absl::OkStatus();
    return response.status();
  }

  absl::StatusOr<std::vector<etcdserverpb::Member>> MemberList() override {
    etcdserverpb::MemberListRequest request;
    absl::StatusOr<etcdserverpb::MemberListResponse> response =
        cluster_->Call<etcdserverpb::MemberListResponse>(
            "MemberList", Repeat::kAlways, true,
            [&request](Member& member, grpc::ClientContext* context,
                       etcdserverpb::MemberListResponse* out) {
              return member.cluster->MemberList(context, request, out);
            });
    if (!response.ok()) return response.status();
    return std::vector<etcdserverpb::Member>(response->members().begin(),
                                             response->members().end());
  }

  absl::StatusOr<etcdserverpb::Member> MemberAdd(absl::string_view peer_url,
                                                 bool learner) override {
    etcdserverpb::MemberAddRequest request;
    request.add_peerurls(std::string(peer_url));
    request.set_islearner(learner);
    absl::StatusOr<etcdserverpb::MemberAddResponse> response =
        cluster_->Call<etcdserverpb::MemberAddResponse>(
            absl::StrCat("MemberAdd ", peer_url), Repeat::kIfUnsent, true,
            [&request](Member& member, grpc::ClientContext* context,
                       etcdserverpb::MemberAddResponse* out) {
              return member.cluster->MemberAdd(context, request, out);
            });
    if (!response.ok()) return response.status();
    return response->member();
  }

  absl::Status MemberRemove(uint64_t id) override {
    etcdserverpb::MemberRemoveRequest request;
    request.set_id(id);
    bool maybe_applied = false;
    absl::StatusOr<etcdserverpb::MemberRemoveResponse> response =
        cluster_->Call<etcdserverpb::MemberRemoveResponse>(
            absl::StrFormat("MemberRemove %x", id), Repeat::kAlways, true,
            [&request](Member& member, grpc::ClientContext* context,
                       etcdserverpb::MemberRemoveResponse* out) {
              return member.cluster->MemberRemove(context, request, out);
            },
            &maybe_applied);
    // Removed by an attempt whose answer was lost.
    if (absl::IsNotFound(response.status()) && maybe_applied) return absl::OkStatus();
    return response.status();
  }

  absl::Status MemberPromote(uint64_t id) override {
    etcdserverpb::MemberPromoteRequest request;
    request.set_id(id);
    return cluster_
        ->Call<etcdserverpb::MemberPromoteResponse>(
            absl::StrFormat("MemberPromote %x", id), Repeat::kAlways, true,
            [&request](Member& member, grpc::ClientContext* context,
                       etcdserverpb::MemberPromoteResponse* out) {
              return member.cluster->MemberPromote(context, request, out);
            })
        .status();
  }

  absl::Status EnableRootAuth(absl::string_view password) override {
    etcdserverpb::AuthUserAddRequest add;
    add.set_name("root");
    add.set_password(std::string(password));
    absl::Status status = Unauthenticated<etcdserverpb::AuthUserAddResponse>(
        "UserAdd root", [&add](Member& member, grpc::ClientContext* context,
                               etcdserverpb::AuthUserAddResponse* out) {
          return member.auth->UserAdd(context, add, out);
        });
    if (!status.ok() && !absl::StrContains(status.message(), "user name already exists")) {
      return status;
    }
    etcdserverpb::AuthUserGrantRoleRequest grant;
    grant.set_user("root");
    grant.set_role("root");
    status = Unauthenticated<etcdserverpb::AuthUserGrantRoleResponse>(
        "UserGrantRole root", [&grant](Member& member, grpc::ClientContext* context,
                                       etcdserverpb::AuthUserGrantRoleResponse* out) {
          return member.auth->UserGrantRole(context, grant, out);
        });
    if (!status.ok() && !absl::StrContains(status.message(), "already granted")) return status;
    etcdserverpb::AuthEnableRequest enable;
    return Unauthenticated<etcdserverpb::AuthEnableResponse>(
        "AuthEnable", [&enable](Member& member, grpc::ClientContext* context,
                                etcdserverpb::AuthEnableResponse* out) {
          return member.auth->AuthEnable(context, enable, out);
        });
  }

  void SetEndpoints(const std::vector<std::string>& endpoints) override {
    cluster_->SetEndpoints(endpoints);
  }
  std::vector<std::string> Endpoints() const override { return cluster_->Endpoints(); }

  absl::StatusOr<std::vector<int64_t>> Leases() override {
    etcdserverpb::LeaseLeasesRequest request;
    absl::StatusOr<etcdserverpb::LeaseLeasesResponse> response =
        cluster_->Call<etcdserverpb::LeaseLeasesResponse>(
            "LeaseLeases", Repeat::kAlways, true,
            [&request](Member& member, grpc::ClientContext* context,
                       etcdserverpb::LeaseLeasesResponse* out) {
              return member.lease->LeaseLeases(context, request, out);
            });
    if (!response.ok()) return response.status();
    std::vector<int64_t> out;
    for (const etcdserverpb::LeaseStatus& lease : response->leases()) out.push_back(lease.id());
    return out;
  }

  std::unique_ptr<LeaseKeeper> KeepAlive(int64_t lease, absl::Duration ttl,
                                         std::function<void(absl::Status)> on_lost) override {
    auto keeper = std::make_unique<Keeper>(cluster_, lease, ttl, std::move(on_lost));
    keeper->Start();
    return keeper;
  }

  std::unique_ptr<EtcdWatch> Watch(
      std::string key, std::string range_end, int64_t start_revision,
      std::function<void(const std::vector<mvccpb::Event>&, int64_t revision)> on_events,
      std::function<void(absl::Status)> on_end) override {
    auto watcher =
        std::make_unique<Watcher>(cluster_, std::move(key), std::move(range_end), start_revision,
                                  std::move(on_events), std::move(on_end));
    watcher->Start();
    return watcher;
  }

 private:
  absl::StatusOr<RangeResponse> Range(absl::string_view what, const RangeRequest& request) {
    return cluster_->Call<RangeResponse>(
        what, Repeat::kAlways, true,
        [&request](Member& member, grpc::ClientContext* context, RangeResponse* out) {
          return member.kv->Range(context, request, out);
        });
  }

  absl::StatusOr<int64_t> DeleteRange(absl::string_view what, const DeleteRangeRequest& request) {
    absl::StatusOr<DeleteRangeResponse> response = cluster_->Call<DeleteRangeResponse>(
        what, Repeat::kAlways, true,
        [&request](Member& member, grpc::ClientContext* context, DeleteRangeResponse* out) {
          return member.kv->DeleteRange(context, request, out);
        });
    if (!response.ok()) return response.status();
    return response->deleted();
  }

  template <typename Response>
  absl::Status Unauthenticated(absl::string_view what, const Rpc<Response>& rpc) {
    return cluster_->Call<Response>(what, Repeat::kAlways, false, rpc).status();
  }

  // Follows the cluster's voters (EtcdOptions::auto_sync_interval); a
  // failure leaves the members as they were, for the next try.
  void SyncEndpoints() {
    absl::StatusOr<std::vector<etcdserverpb::Member>> members = MemberList();
    if (!members.ok()) {
      cluster_->logger().debug("etcd's members not synced: {}", members.status().message());
      return;
    }
    std::vector<std::string> endpoints;
    for (const etcdserverpb::Member& member : *members) {
      if (member.islearner() || member.clienturls().empty()) continue;
      if (std::optional<std::string> endpoint = EndpointOfUrl(member.clienturls(0))) {
        endpoints.push_back(*std::move(endpoint));
      }
    }
    cluster_->SetEndpoints(endpoints);
  }

  static int64_t NewLeaseId() {
    thread_local absl::BitGen random;
    return absl::Uniform<int64_t>(random, 1, std::numeric_limits<int64_t>::max());
  }

  const std::shared_ptr<Cluster> cluster_;
  absl::Notification stop_sync_;
  std::thread syncer_;  // with auto_sync_interval
};

}  // namespace

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Create(EtcdOptions options) {
  if (options.endpoints.empty()) {
    return absl::InvalidArgumentError("no etcd endpoint given");
  }
  if (options.call_timeout <= absl::ZeroDuration() ||
      options.attempt_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd call_timeout (", absl::FormatDuration(options.call_timeout),
                     ") and attempt_timeout (", absl::FormatDuration(options.attempt_timeout),
                     ") must be positive"));
  }
  if (options.max_response_bytes <= 0) {
    return absl::InvalidArgumentError("etcd max_response_bytes must be positive");
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!options.tls.empty()) {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> tls =
        rdzv::ClientTlsCredentials(options.tls);
    if (!tls.ok()) return tls.status();
    credentials = *std::move(tls);
  }
  return std::make_unique<EtcdClientImpl>(
      std::make_shared<Cluster>(std::move(options), credentials));
}

}  // namespace muster::etcd
