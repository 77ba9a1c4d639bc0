// Shared by the route tests: the message of the strata::Error a call throws.
#pragma once

#include <string>

#include "util/error.h"
#include "test_util.h"

namespace strata::route::testing {

using strata::testing::error_of;


}  // namespace strata::route::testing
