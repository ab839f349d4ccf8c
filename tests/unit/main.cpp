#include "test.hpp"

int main(int argc, char** argv) { return symmem::test::run_all(argc, argv); }
