#include "plan/capacity_failure.hpp"

namespace symmem::detail {

std::string describe_capacity_failure(const LayoutFault& f, const std::string& call,
                                      const std::function<std::string(int)>& rank_name) {
  const std::string who = rank_name(f.rank);
  const std::string needed = std::to_string(f.needed) + (f.needed == 0xFFFFFFFFull ? " or more" : "");
  const std::string capacity = std::to_string(f.capacity) + (f.capacity == 0x7FFFFFFFull ? " or more" : "");
  std::string what;
  switch (f.kind) {
    case kFaultInvalidSplit:
      what = who + " passed a negative split, or one above 2^31 - 1, for destination " + std::to_string(f.other);
      break;
    case kFaultInputTooSmall:
      what = who + "'s splits add up to " + needed + " rows, but its input holds " + capacity;
      break;
    case kFaultOutputTooSmall:
      what = who + " would receive " + needed + " rows, but its output holds " + capacity;
      break;
    case kFaultDeclaredSplits:
      what =
          who + "'s output splits expect " + capacity + " rows from " + rank_name(f.other) + ", which sends " + needed;
      break;
    case kFaultTokens:
      what = who + " passed " + needed + " tokens, but its context holds " + capacity + " per rank";
      break;
    case kFaultExpertFull:
      what = "expert " + std::to_string(f.other) + " of " + who + " would receive " + needed +
             " rows, but its buffer holds " + capacity;
      break;
    case kFaultExpertId:
      what = who + " routed a token to expert " + needed + ", outside the context's " + capacity + " experts";
      break;
    default: what = who + " does not fit this call's buffers (fault " + std::to_string(f.kind) + ")"; break;
  }
  return what + " (in " + call + "); every rank found this before any row moved, and the communicator is unusable now";
}

}  // namespace symmem::detail
