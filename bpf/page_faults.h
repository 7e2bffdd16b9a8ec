/* SPDX-License-Identifier: GPL-2.0 */
#ifndef EBPF_METRICSD_PAGE_FAULTS_H
#define EBPF_METRICSD_PAGE_FAULTS_H

enum page_fault_type {
	PAGE_FAULT_MINOR = 0,
	PAGE_FAULT_MAJOR = 1,
	PAGE_FAULT__COUNT,
};

#endif
