#pragma once
// Factories for the built-in rules (one .cpp per rule in this folder); the list is in builtin_rules.cpp.

#include <memory>

#include "bnfold/rewrite/rule.h"

namespace bnfold::rules {}  // namespace bnfold::rules
