#include "rendezvous/etcd/members.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace muster::etcd {
namespace {

// Keeps only the entries of `since` whose id is in `ids`, and adds those of
// `ids` not there yet at `now`.
void Track(std::map<uint64_t, absl::Time>& since, const std::set<uint64_t>& ids, absl::Time now) {
  for (auto it = since.begin(); it != since.end();) {
    it = ids.count(it->first) ? std::next(it) : since.erase(it);
  }
  for (uint64_t id : ids) since.emplace(id, now);
}

// The offer to seat: not a member yet; fewest members on its host, then the
// smallest node id. nullptr: none.
const MemberOffer* Newcomer(const std::vector<MemberView>& members,
                            const std::vector<MemberOffer>& offers) {
  std::set<std::string> member_urls;
  for (const MemberView& member : members) member_urls.insert(member.peer_url);
  std::map<std::string, int> per_host;
  for (const MemberOffer& offer : offers) {
    if (member_urls.count(offer.peer_url)) ++per_host[offer.host];
  }
  const MemberOffer* best = nullptr;
  for (const MemberOffer& offer : offers) {
    if (member_urls.count(offer.peer_url)) continue;
    if (best == nullptr || per_host[offer.host] < per_host[best->host] ||
        (per_host[offer.host] == per_host[best->host] && offer.node < best->node)) {
      best = &offer;
    }
  }
  return best;
}

}  // namespace

MemberStep MemberPlanner::Next(const std::vector<MemberView>& members,
                               const std::vector<MemberOffer>& offers, absl::Time now, int size) {
  std::set<std::string> offered;
  for (const MemberOffer& offer : offers) offered.insert(offer.peer_url);
  std::set<uint64_t> orphans, unstarted_learners;
  int started_voters = 0, voters = 0;
  for (const MemberView& member : members) {
    if (!offered.count(member.peer_url)) orphans.insert(member.id);
    if (member.learner && !member.started) unstarted_learners.insert(member.id);
    if (!member.learner) ++voters;
    if (!member.learner && member.started) ++started_voters;
  }
  Track(orphan_since_, orphans, now);
  Track(learner_since_, unstarted_learners, now);

  MemberStep step;
  for (const MemberView& member : members) {
    if (!orphans.count(member.id) || now - orphan_since_[member.id] < kOfferGrace) continue;
    // The last voter that runs holds the job's state: never removed.
    if (!member.learner && member.started && started_voters <= 1) continue;
    step.kind = MemberStep::Kind::kRemove;
    step.member = member.id;
    step.why = absl::StrCat("member ", member.peer_url, " has had no node offering it for ",
                            absl::FormatDuration(now - orphan_since_[member.id]),
                            " (its node was lost, or its etcd stopped)");
    return step;
  }
  bool learner = false;
  for (const MemberView& member : members) {
    if (!member.learner) continue;
    learner = true;
    if (member.started) {
      step.kind = MemberStep::Kind::kPromote;
      step.member = member.id;
      step.why = absl::StrCat("learner ", member.peer_url, " has started");
      return step;
    }
    if (now - learner_since_[member.id] >= kLearnerStartTimeout) {
      step.kind = MemberStep::Kind::kRemove;
      step.member = member.id;
      step.why = absl::StrCat("learner ", member.peer_url, " has not started in ",
                              absl::FormatDuration(now - learner_since_[member.id]));
      return step;
    }
  }
  if (learner || voters >= size) return step;
  if (const MemberOffer* newcomer = Newcomer(members, offers)) {
    step.kind = MemberStep::Kind::kAdd;
    step.offer = *newcomer;
    step.why = absl::StrCat("the cluster has ", voters, " of ", size, " members");
  }
  return step;
}

std::string InitialCluster(const std::vector<std::pair<std::string, std::string>>& members) {
  return absl::StrJoin(members, ",", [](std::string* out, const auto& member) {
    absl::StrAppend(out, member.first, "=", member.second);
  });
}

}  // namespace muster::etcd
