#include "cli/common.h"

int main(int argc, char** argv) { return thindisk::cli::RunThindisk(argc, argv); }
