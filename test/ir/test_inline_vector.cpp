#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <utility>
#include <vector>

#include "bnfold/ir/inline_vector.h"

using namespace bnfold;

namespace {

template <typename T, std::size_t N>
std::vector<T> contents(const InlineVector<T, N>& list) {
  return std::vector<T>(list.begin(), list.end());
}

}  // namespace

// A random walk of the operations the IR uses, checked against std::vector after every step: it crosses the
// boundary between inline and heap storage in both directions of size, many times.
TEST_CASE("InlineVector holds what a std::vector holds, inline and on the heap", "[ir][inline_vector]") {
  std::mt19937 random(GENERATE(1u, 2u, 3u));
  InlineVector<int, 2> list;
  std::vector<int> expected;
  for (int step = 0; step < 2000; ++step) {
    const int value = static_cast<int>(random() % 1000);
    switch (random() % 6) {
      case 0:
      case 1:
        list.push_back(value);
        expected.push_back(value);
        break;
      case 2:
        if (!expected.empty()) {
          list.pop_back();
          expected.pop_back();
        }
        break;
      case 3:
        if (!expected.empty()) {
          const std::size_t at = random() % expected.size();
          list.erase(list.begin() + at);
          expected.erase(expected.begin() + static_cast<std::ptrdiff_t>(at));
        }
        break;
      case 4: {
        const std::size_t size = random() % 6;
        list.resize(size, value);
        expected.resize(size, value);
        break;
      }
      case 5:
        list.erase(std::remove(list.begin(), list.end(), value % 10), list.end());
        expected.erase(std::remove(expected.begin(), expected.end(), value % 10), expected.end());
        break;
    }
    REQUIRE(contents(list) == expected);
    REQUIRE(list.size() == expected.size());
    REQUIRE(list.empty() == expected.empty());
    if (!expected.empty()) {
      REQUIRE(list.front() == expected.front());
      REQUIRE(list.back() == expected.back());
    }
  }
}

TEST_CASE("InlineVector copies and moves inline and heap storage", "[ir][inline_vector]") {
  for (int count : {0, 1, 2, 3, 9}) {
    InlineVector<int, 2> original;
    std::vector<int> expected;
    for (int i = 0; i < count; ++i) {
      original.push_back(i * 7);
      expected.push_back(i * 7);
    }
    InlineVector<int, 2> copy(original);
    CHECK(contents(copy) == expected);
    CHECK(copy == original);
    copy.push_back(-1);  // the copy has storage of its own
    CHECK(contents(original) == expected);

    InlineVector<int, 2> moved(std::move(copy));
    expected.push_back(-1);
    CHECK(contents(moved) == expected);
    CHECK(copy.empty());  // NOLINT(bugprone-use-after-move): a moved-from list is empty and usable
    copy.push_back(5);
    CHECK(contents(copy) == std::vector<int>{5});

    InlineVector<int, 2> assigned;
    assigned.push_back(42);
    assigned = moved;
    CHECK(contents(assigned) == expected);
    assigned = std::move(moved);
    CHECK(contents(assigned) == expected);
    const InlineVector<int, 2>& same = assigned;
    assigned = same;  // self-assignment keeps the contents
    CHECK(contents(assigned) == expected);
  }
}

TEST_CASE("InlineVector::push_back of one of its own elements survives the growth it causes", "[ir][inline_vector]") {
  InlineVector<int, 1> list;
  list.push_back(3);
  list.push_back(list.front());  // grows from inline to heap storage while reading the inline element
  list.push_back(list.back());   // grows on the heap
  CHECK(contents(list) == std::vector<int>{3, 3, 3});
}
