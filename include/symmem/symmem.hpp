// symmem: GPU collectives on symmetric memory. Include this one header.
#pragma once

#include "symmem/all_to_all.hpp"
#include "symmem/bootstrap.hpp"
#include "symmem/collectives.hpp"
#include "symmem/fused.hpp"
#include "symmem/communicator.hpp"
#include "symmem/ep.hpp"
#include "symmem/error.hpp"
#include "symmem/types.hpp"
