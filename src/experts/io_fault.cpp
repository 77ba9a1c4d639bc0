#include "experts/io_fault.h"

#include <cerrno>
#include <cstdlib>
#include <sstream>
#include <vector>

#include "experts/pack.h"
#include "util/error.h"

namespace strata::experts {

namespace {

class FaultyIo : public FileIo {
 public:
  FaultyIo(std::unique_ptr<FileIo> inner, FaultInjector& injector)
      : inner_(std::move(inner)), injector_(injector) {}

  const char* name() const override { return inner_->name(); }

  // The faulted batch still goes to the real FileIo in one call (one io_uring submission):
  // EIO ops are left out, short ones go in with a smaller length.
  void read(int fd, std::span<ReadOp> ops) override {
    std::vector<FaultInjector::Fault> faults(ops.size());
    std::vector<ReadOp> issued;
    std::vector<size_t> index;
    for (size_t i = 0; i < ops.size(); ++i) {
      faults[i] = injector_.draw();
      if (faults[i] == FaultInjector::Fault::Eio) {
        ops[i].result = -EIO;
        continue;
      }
      ReadOp op = ops[i];
      // Whole 4 KiB pages, so an O_DIRECT read stays legal; a one-page read asks for nothing.
      if (faults[i] == FaultInjector::Fault::Short)
        op.length = op.length / 2 / kPackAlignment * kPackAlignment;
      issued.push_back(op);
      index.push_back(i);
    }
    if (!issued.empty()) inner_->read(fd, issued);
    for (size_t k = 0; k < issued.size(); ++k) {
      ReadOp& op = ops[index[k]];
      op.result = issued[k].result;
      if (faults[index[k]] == FaultInjector::Fault::Flip && op.result > 0) {
        static_cast<uint8_t*>(op.dst)[size_t(op.result) / 2] ^= 0x10;
        injector_.count_flip();
      }
    }
  }

 private:
  std::unique_ptr<FileIo> inner_;
  FaultInjector& injector_;
};

double rate(const std::string& key, const std::string& value) {
  char* end = nullptr;
  const double r = std::strtod(value.c_str(), &end);
  if (value.empty() || end != value.c_str() + value.size() || !(r >= 0 && r <= 1))
    fail("STRATA_IO_FAULTS: ", key, "=", value, " is not a rate between 0 and 1");
  return r;
}

}  // namespace

FaultRates parse_fault_rates(const std::string& spec) {
  FaultRates r;
  std::istringstream in(spec);
  for (std::string part; std::getline(in, part, ',');) {
    const size_t eq = part.find('=');
    const std::string key = part.substr(0, eq), value = eq == std::string::npos ? "" : part.substr(eq + 1);
    if (key == "eio") {
      r.eio = rate(key, value);
    } else if (key == "short") {
      r.short_read = rate(key, value);
    } else if (key == "flip") {
      r.flip = rate(key, value);
    } else if (key == "seed") {
      char* end = nullptr;
      r.seed = std::strtoull(value.c_str(), &end, 10);
      if (value.empty() || end != value.c_str() + value.size())
        fail("STRATA_IO_FAULTS: seed=", value, " is not a number");
    } else {
      fail("STRATA_IO_FAULTS: '", part, "' is not one of eio=, short=, flip=, seed=");
    }
  }
  if (r.eio + r.short_read + r.flip > 1)
    fail("STRATA_IO_FAULTS: the rates add up to more than 1");
  return r;
}

void FaultInjector::set_rates(FaultRates rates) {
  std::lock_guard lock(mutex_);
  rates_ = rates;
}

FaultRates FaultInjector::rates() const {
  std::lock_guard lock(mutex_);
  return rates_;
}

FaultInjector::Counts FaultInjector::counts() const {
  std::lock_guard lock(mutex_);
  return counts_;
}

std::string FaultInjector::summary() const {
  const Counts c = counts();
  return cat("I/O faults injected: ", c.eio, " EIO, ", c.short_reads, " short reads, ", c.flips,
             " bit flips in ", c.reads, " reads");
}

FaultInjector::Fault FaultInjector::draw() {
  std::lock_guard lock(mutex_);
  ++counts_.reads;
  const double u = double(rng_.next() >> 11) * 0x1p-53;
  if (u < rates_.eio) {
    ++counts_.eio;
    return Fault::Eio;
  }
  if (u < rates_.eio + rates_.short_read) {
    ++counts_.short_reads;
    return Fault::Short;
  }
  if (u < rates_.eio + rates_.short_read + rates_.flip) return Fault::Flip;  // counted once applied
  return Fault::None;
}

void FaultInjector::count_flip() {
  std::lock_guard lock(mutex_);
  ++counts_.flips;
}

std::unique_ptr<FileIo> FaultInjector::wrap(std::unique_ptr<FileIo> inner) {
  return std::make_unique<FaultyIo>(std::move(inner), *this);
}

}  // namespace strata::experts
