// The tests' check that a call fails with a k3moe::Error naming what it should.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <string>
#include <vector>

#include "k3moe/error.h"

namespace k3moe::testing {

// Runs `fn`, expects a k3moe::Error whose message holds every one of `needles`.
template <class Fn>
void expect_error(Fn&& fn, const std::vector<std::string>& needles, const std::string& what = "") {
  try {
    fn();
    ADD_FAILURE() << what << ": no error thrown";
  } catch (const Error& e) {
    for (const std::string& needle : needles)
      EXPECT_NE(e.message().find(needle), std::string::npos)
          << what << ": message lacks \"" << needle << "\":\n  " << e.message();
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": threw a non-k3moe exception: " << e.what();
  }
}

}  // namespace k3moe::testing
