#include "cli/spec_flags.h"

#include "util/error.h"

namespace strata::cli {

void add_spec_flags(CLI::App* cmd, SpecFlags& f, bool with_knob) {
  cmd->add_option("--spec", f.mode,
                  "Speculative decoding: off, mtp (the model's MTP head), suffix (prompt lookup), "
                  "auto (both, SpecGate picks); exact either way")
      ->capture_default_str();
  cmd->add_option("--spec-depth", f.depth, "Fixed drafts per window instead of SpecGate's choice");
  cmd->add_option("--spec-max-depth", f.max_depth, "Deepest window SpecGate may choose, in drafts")
      ->capture_default_str();
  cmd->add_option("--draft-vocab", f.draft_vocab,
                  "MTP drafts come from the first N token ids (the frequent ones) and the special "
                  "tokens; 0: every id; default 65536 on the CPU, every id on a GPU. Exact either "
                  "way (the model verifies every draft)");
  cmd->add_flag("--spec-typical", f.typical,
                "Typical acceptance: longer accepted runs, but NOT the tokens of plain decoding");
  if (with_knob)
    cmd->add_option("--mtp-acceptance", f.mtp_acceptance,
                    "Benchmark knob with --continue-from: MTP drafts are the text's next token with "
                    "this probability per position (random weights make the head's own drafts "
                    "meaningless); 0 is off");
}

spec::Options spec_options(const SpecFlags& f) {
  spec::Options o;
  o.mode = spec::parse_mode(f.mode);
  if (f.depth < -1 || f.depth > spec::kMaxDepth)
    fail("--spec-depth: ", f.depth, " is outside 0..", spec::kMaxDepth);
  if (f.depth >= 0) o.depth = f.depth;
  if (f.max_depth < 0 || f.max_depth > spec::kMaxDepth)
    fail("--spec-max-depth: ", f.max_depth, " is outside 0..", spec::kMaxDepth);
  o.max_depth = f.max_depth;
  o.typical = f.typical;
  o.mtp_acceptance_knob = f.mtp_acceptance;
  if (f.draft_vocab < -1) fail("--draft-vocab: ", f.draft_vocab, " is negative (0 means every id)");
  if (f.draft_vocab >= 0) o.draft_vocab = f.draft_vocab;
  return o;
}

}  // namespace strata::cli
