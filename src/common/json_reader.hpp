// A reader for the flat JSON the shipped tables use (plan/tuning_table.hpp, nccl/cutover_table.hpp):
// objects of strings and numbers, and arrays of such objects; and the quoting their writers use.
// Errors are kInvalidArgument naming the table and the character where reading stopped. No CUDA.
#pragma once

#include <cctype>
#include <string>
#include <utility>

#include "symmem/error.hpp"

namespace symmem::detail {

class FlatJsonReader {
 public:
  // `what` names the table in errors ("tuning table").
  FlatJsonReader(const std::string& text, std::string what) : s_(text), what_(std::move(what)) {}

  void expect(char c) {
    skip();
    if (pos_ >= s_.size() || s_[pos_] != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  bool consume(char c) {
    skip();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool peek(char c) {
    skip();
    return pos_ < s_.size() && s_[pos_] == c;
  }
  std::string string() {
    expect('"');
    std::string out;
    while (pos_ < s_.size() && s_[pos_] != '"') {
      if (s_[pos_] == '\\' && pos_ + 1 < s_.size()) ++pos_;
      out.push_back(s_[pos_++]);
    }
    expect('"');
    return out;
  }
  double number() {
    skip();
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(s_.substr(pos_), &used);
    } catch (...) {
      fail("expected a number");
    }
    pos_ += used;
    return v;
  }
  // Reads an object {"key": value, ...}: `value(key)` reads the value of a key it takes and
  // returns true; the value of any other key (a string or a number: e.g. measured times) is skipped.
  template <typename Value>
  void object(Value&& value) {
    expect('{');
    for (bool first = true; !consume('}'); first = false) {
      if (!first) expect(',');
      const std::string key = string();
      expect(':');
      if (value(key)) continue;
      if (peek('"'))
        string();
      else
        number();
    }
  }
  // Reads an array [element, ...]: `element()` reads each.
  template <typename Element>
  void array(Element&& element) {
    expect('[');
    for (bool first = true; !consume(']'); first = false) {
      if (!first) expect(',');
      element();
    }
  }
  void done() {
    skip();
    if (pos_ != s_.size()) fail("trailing characters");
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(ErrorCode::kInvalidArgument, what_ + ": " + what + " at character " + std::to_string(pos_));
  }

 private:
  void skip() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  const std::string& s_;
  std::string what_;
  size_t pos_ = 0;
};

// `s` as a JSON string, quoted, for the tables' writers.
inline std::string json_quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out + "\"";
}

}  // namespace symmem::detail
