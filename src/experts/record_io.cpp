#include "experts/record_io.h"

#include <unordered_map>

#include "util/error.h"

namespace strata::experts {

namespace {

class ReaderIo : public RecordIo {
 public:
  ReaderIo(const Pack& pack, const ReaderOptions& options) : reader_(pack, options) {}

  Id submit(int layer, int expert, void* dst, Priority priority) override {
    const Id id = next_++;
    tickets_.emplace(id, reader_.submit(layer, expert, dst, priority));
    return id;
  }
  void wait(Id id) override {
    const Ticket t = take(id);
    reader_.wait(t);
  }
  bool cancel(Id id) override {
    if (!reader_.cancel(ticket(id))) return false;
    take(id);
    return true;
  }
  void promote(Id id) override { reader_.promote(ticket(id)); }
  Counters counters() const override {
    const ReaderStats s = reader_.stats();
    return {s.bytes, s.busy_seconds};
  }

 private:
  const Ticket& ticket(Id id) const {
    const auto it = tickets_.find(id);
    if (it == tickets_.end()) fail("expert reader: request ", id, " is not pending");
    return it->second;
  }
  Ticket take(Id id) {
    const Ticket t = ticket(id);
    tickets_.erase(id);
    return t;
  }

  ExpertReader reader_;
  std::unordered_map<Id, Ticket> tickets_;
  Id next_ = 1;
};

}  // namespace

std::unique_ptr<RecordIo> make_reader_io(const Pack& pack, const ReaderOptions& options) {
  return std::make_unique<ReaderIo>(pack, options);
}

}  // namespace strata::experts
