// Slurm's hostlist syntax, parsed natively (no call to scontrol):
// "gpu[01-04,07]", "a[1-2]-ib", "rack[1-2]-n[1-3]", "n1,n3 n5".
#ifndef MUSTER_COMMON_HOSTLIST_H_
#define MUSTER_COMMON_HOSTLIST_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muster {

// The host names of a hostlist, in order. Items are separated by commas
// (outside brackets) or white space; an item is text with any number of
// bracket groups, each a comma list of numbers and ranges "lo-hi", expanded
// as their product, left group slowest. A number keeps the width it is
// written with ("01-04" gives 01, 02, 03, 04). kInvalidArgument, quoting the
// list and naming the fault: an unclosed or empty bracket, a range that
// runs backwards, something that is not a number, or more than `limit` hosts.
absl::StatusOr<std::vector<std::string>> ExpandHostlist(absl::string_view list,
                                                        size_t limit = 1 << 20);

}  // namespace muster

#endif  // MUSTER_COMMON_HOSTLIST_H_
